#include "harness/http.h"

#include "core/error.h"

namespace sala::harness {

std::string normalize_base_url(const std::string& url) {
  std::string u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  if (u.rfind("http://", 0) != 0)
    fail("--url must start with http:// (got '{}')", url);
  if (u.find('/', 7) != std::string::npos)
    fail("--url must be scheme://host:port without a path (got '{}')", url);
  if (u.size() <= 7) fail("--url has no host: '{}'", url);
  return u;
}

std::unique_ptr<httplib::Client> make_client(const std::string& base_url, double read_timeout_s) {
  auto cli = std::make_unique<httplib::Client>(base_url);
  auto sec = static_cast<time_t>(read_timeout_s);
  auto usec = static_cast<time_t>((read_timeout_s - static_cast<double>(sec)) * 1e6);
  cli->set_connection_timeout(30, 0);
  cli->set_read_timeout(sec, usec);
  cli->set_write_timeout(600, 0);
  return cli;
}

nlohmann::json get_json(const std::string& base_url, const std::string& path, double timeout_s) {
  auto cli = make_client(base_url, timeout_s);
  auto res = cli->Get(path);
  if (!res) fail("GET {}{} failed: {}", base_url, path, httplib::to_string(res.error()));
  if (res->status != 200)
    fail("GET {}{} returned HTTP {}: {}", base_url, path, res->status, res->body.substr(0, 500));
  try {
    return nlohmann::json::parse(res->body);
  } catch (const std::exception& e) {
    fail("GET {}{}: response is not JSON ({})", base_url, path, e.what());
  }
}

std::string served_model_id(const std::string& base_url) {
  auto j = get_json(base_url, "/v1/models");
  if (!j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    fail("GET {}/v1/models: no data[0].id in {}", base_url, j.dump().substr(0, 300));
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace sala::harness
