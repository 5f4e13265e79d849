// The connection layer under cpp-httplib's request handling: our own keep-alive loop
// (Server::process_and_close_socket is virtual, process_request protected), so the rules
// below hold for every route, including routes added later.
//
// Why not httplib's loop (Debian's 0.11.4, measured in issue 23):
//  * it builds a new buffered SocketStream per request, so pipelined requests buffered behind
//    the first one were dropped: our stream lives as long as the connection;
//  * no header deadline (60 s per read, a slow client holds a worker for ever) and no
//    connection cap: we read the header block ourselves under a deadline and cap connections.
//    At the cap a new connection makes room: the oldest idle keep-alive connection is closed,
//    else the one that has been sending its request (headers, or a body it is still being
//    waited on for) the longest is answered 503 and closed; only when every connection is
//    inside a handler is the new one refused with 503. So a swarm trickling headers or bodies
//    cannot keep a fresh request out (tests/server/test_slow_clients.py);
//  * Content-Length "-1" (read as 2^64-1, then 60 s of skipping), duplicate differing
//    Content-Length and Transfer-Encoding + Content-Length are refused at once with 400;
//  * Content-Encoding bodies are inflated without limit (the payload cap applies to the
//    compressed length; a 298 KB gzip body became 300 MB, 10.6 GB RSS): refused with 415
//    before any byte of the body is read; chunked bodies are capped at the payload limit;
//  * a POST with neither Content-Length nor Transfer-Encoding has an empty body (RFC 9112
//    6.3), where httplib waited for the peer to close;
//  * its default socket options set SO_REUSEPORT, so a second server bound the same port.
// One structured log line per request is printed here, after the whole response (a stream
// included) was written; handlers fill the current RequestRecord.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>

namespace sala::server {

struct GuardOptions {
  int header_timeout_s = 10;     // whole request line + headers, from the first byte
  int keep_alive_timeout_s = 5;  // idle wait for the next request on a connection
  int read_timeout_s = 60;       // one body read
  // The whole body, from the end of the headers: a client trickling a body a byte at a time
  // otherwise holds a worker (connections in a request are never evicted) for as long as it
  // likes; 600 of them took every worker (found by tests/soak). Answered with 408.
  int body_timeout_s = 60;
  int write_timeout_s = 60;
  int max_connections = 0;       // open connections at once; 0: no cap
  size_t max_header_bytes = size_t(64) << 10;
  size_t max_body_bytes = size_t(256) << 20;
  bool log_requests = true;
};

// What one request did, for its log line. Handlers run on the connection's thread, so the
// record is reachable through a thread-local pointer while the request is processed.
struct RequestRecord {
  std::string id;       // request id given to the client (empty for routes without one)
  std::string method, path;
  int status = 0;
  int64_t prompt_tokens = -1, completion_tokens = -1;
  double ttft_s = -1;
  std::string error;    // error message (also what the client was told)
  bool close_after = false;  // the body was left unread: the connection cannot be reused
  bool body_timed_out = false;  // GuardOptions::body_timeout_s passed while reading the body
  bool evicted = false;  // closed while waiting for its body, to make room at the connection cap
};

// The record of the request being processed on this thread; null outside a request.
RequestRecord* current_request();

class GuardedServer : public httplib::Server {
 public:
  void configure(const GuardOptions& o) { g_ = o; }
  const GuardOptions& guard_options() const { return g_; }
  // Binds without SO_REUSEPORT (a second server on a used port must fail, not share it) and
  // listens with `backlog`. Returns the bound port, or -1 with errno set.
  int bind_exclusive(const std::string& host, int port, int backlog);
  // Draining: idle keep-alive connections are closed, no connection is kept alive.
  void set_draining(bool on) { draining_ = on; }
  bool draining() const { return draining_; }
  int64_t requests_in_progress() const { return in_request_; }
  int64_t connections_open() const { return open_; }
  int64_t connections_refused() const { return refused_; }
  int64_t connections_evicted() const { return evicted_; }

 private:
  struct Slot {
    int fd;
    int phase;  // 0 idle between requests, 1 reading headers (a new connection too), 2 in a request, 3 evicted
    // Phase 2: blocked waiting for body bytes. Only then may it be evicted: once its body is
    // read the request is being handled, and cutting it would lose work the client paid for.
    bool waiting;
    // Phase 0: since the last request ended; 1 and 2: since the request's first byte (for a
    // connection's first request, since it was accepted).
    std::chrono::steady_clock::time_point since;
  };
  bool process_and_close_socket(socket_t sock) override;
  bool admit(std::list<Slot>::iterator& me, int fd);
  // False if the connection was evicted (it then stays so).
  bool set_phase(std::list<Slot>::iterator me, int phase);
  bool set_waiting(std::list<Slot>::iterator me, bool waiting);
  void leave(std::list<Slot>::iterator me);

  GuardOptions g_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_request_{0}, open_{0}, refused_{0}, evicted_{0};
  std::mutex mu_;
  std::list<Slot> slots_;
};

}  // namespace sala::server
