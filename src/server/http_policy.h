// Who may call which route how, decided before a request body is read (cpp-httplib's
// pre-routing handler): CORS origins and preflight, draining, the API key, methods, and the
// JSON media type of POST bodies. A browser page on any site can send "simple" cross-origin
// requests (text/plain or form bodies, no preflight) to a server on localhost: requiring
// application/json forces a preflight, and an Origin not allowed gets 403.
#pragma once

#include <httplib.h>

#include <string>
#include <vector>

namespace sala::server {

struct PolicyOptions {
  std::string api_key;                       // empty: no authentication
  std::vector<std::string> allowed_origins;  // CORS origins ("*": any); empty: none
  bool protect_metrics = false;              // /metrics needs the key too
};

// Handled: `res` holds the answer (a refusal, or a preflight's 204) and the body was not read.
httplib::Server::HandlerResponse apply_policy(const PolicyOptions& p, bool draining,
                                              const httplib::Request& req, httplib::Response& res);

// Constant-time comparison (an API key must not be guessable byte by byte from timings).
bool same_secret(const std::string& a, const std::string& b);

}  // namespace sala::server
