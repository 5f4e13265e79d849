#include "server/http_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "server/http_guard.h"
#include "server/protocol.h"

namespace sala::server {

namespace {

using HR = httplib::Server::HandlerResponse;

// Methods of the known routes; routes not listed here (added elsewhere) are left to httplib.
// State-changing routes are POST only, so a link or an <img> cannot trigger them.
const std::map<std::string, std::string>& route_methods() {
  static const std::map<std::string, std::string> m = {
      {"/generate", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"},
      {"/flush_cache", "POST"}, {"/v1/models", "GET"}, {"/health", "GET"}, {"/health_generate", "GET"},
      {"/get_server_info", "GET"}, {"/server_info", "GET"}, {"/get_model_info", "GET"}, {"/metrics", "GET"}};
  return m;
}

HR refuse(httplib::Response& res, int status, const std::string& msg, const std::string& type,
          const std::string& code) {
  res.status = status;
  res.set_content(dump(error_body(status, msg, "", type, code)), "application/json");
  // The body was not read: the connection cannot carry another request.
  res.set_header("Connection", "close");
  if (RequestRecord* r = current_request()) {
    r->close_after = true;
    r->error = msg;
  }
  return HR::Handled;
}

std::string media_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  t.erase(std::remove_if(t.begin(), t.end(), [](char c) { return c == ' ' || c == '\t'; }), t.end());
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return t;
}

}  // namespace

bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

HR apply_policy(const PolicyOptions& p, bool draining, const httplib::Request& req, httplib::Response& res) {
  const auto& routes = route_methods();
  const auto route = routes.find(req.path);

  // CORS: a request a browser sent from another origin carries Origin.
  if (req.has_header("Origin")) {
    const std::string origin = req.get_header_value("Origin");
    const bool allowed = std::any_of(p.allowed_origins.begin(), p.allowed_origins.end(),
                                     [&](const std::string& o) { return o == "*" || o == origin; });
    if (!allowed)
      return refuse(res, 403, fmt::format("Origin '{}' is not allowed (see --allowed-origins)", origin),
                    "permission_error", "origin_not_allowed");
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
    if (req.method == "OPTIONS") {  // preflight: no key needed (browsers send none)
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", route != routes.end() ? route->second + ", OPTIONS" : "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
      return HR::Handled;
    }
  } else if (req.method == "OPTIONS") {
    res.status = 204;
    res.set_header("Allow", route != routes.end() ? route->second + ", OPTIONS" : "GET, POST, OPTIONS");
    return HR::Handled;
  }

  if (draining && req.path != "/metrics") {
    res.set_header("Retry-After", "5");
    return refuse(res, 503, "The server is shutting down", "server_error", "shutting_down");
  }

  const bool open = req.path == "/health" || req.path == "/health_generate" ||
                    (req.path == "/metrics" && !p.protect_metrics);
  if (!p.api_key.empty() && !open) {
    const std::string auth = req.get_header_value("Authorization");
    const std::string want = "Bearer " + p.api_key;
    if (!same_secret(auth, want))
      return refuse(res, 401, "Invalid or missing API key (expected 'Authorization: Bearer <key>')",
                    "authentication_error", "invalid_api_key");
  }

  if (route != routes.end()) {
    const std::string& allowed = route->second;
    const bool ok = req.method == allowed || (allowed == "GET" && req.method == "HEAD");
    if (!ok) {
      res.set_header("Allow", allowed);
      return refuse(res, 405, fmt::format("{} {} is not allowed; use {}", req.method, req.path, allowed),
                    "invalid_request_error", "method_not_allowed");
    }
  }

  // A POST body must be declared JSON: text/plain and form bodies are what a cross-site page
  // can send without a preflight.
  const bool has_body = req.has_header("Transfer-Encoding") ||  // the guard allows only chunked
                        req.get_header_value<uint64_t>("Content-Length") > 0;
  if (req.method == "POST" && has_body && media_type(req.get_header_value("Content-Type")) != "application/json")
    return refuse(res, 415,
                  fmt::format("Content-Type '{}' is not accepted: send the body as application/json",
                              req.get_header_value("Content-Type")),
                  "invalid_request_error", "unsupported_media_type");
  return HR::Unhandled;
}

}  // namespace sala::server
