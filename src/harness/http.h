// Small HTTP helpers for the measurement clients (cpp-httplib, plain http:// only).
#pragma once
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace sala::harness {

// "http://host:port[/]" -> "http://host:port". Throws sala::Error on anything else.
std::string normalize_base_url(const std::string& url);

// A client for base_url with the given read timeout (seconds); connect timeout 30 s.
std::unique_ptr<httplib::Client> make_client(const std::string& base_url, double read_timeout_s);

// GET base_url+path and parse the body as JSON; throws sala::Error on failure / non-200.
nlohmann::json get_json(const std::string& base_url, const std::string& path,
                        double timeout_s = 60);

// GET /v1/models -> data[0].id (the served model name; for SGLang the model path).
std::string served_model_id(const std::string& base_url);

}  // namespace sala::harness
