#include "server/http_guard.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <cerrno>
#include <fmt/format.h>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

namespace sala::server {

namespace {

using Clock = std::chrono::steady_clock;
thread_local RequestRecord* tl_record = nullptr;

int wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
    return r;
  }
}

std::string lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = char(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Log lines go through a bounded queue to one writer thread: a request thread never blocks
// on stderr (a supervisor that stops reading a pipe would otherwise stall every request).
// Lines beyond the bound are dropped and counted. Never destroyed: the writer may still be
// blocked in a write when the process exits.
class LogQueue {
 public:
  static LogQueue& get() {
    static LogQueue* q = new LogQueue;
    return *q;
  }
  void push(std::string line) {
    std::lock_guard<std::mutex> lk(mu_);
    if (lines_.size() >= kMaxLines) {
      dropped_++;
      return;
    }
    lines_.push_back(std::move(line));
    cv_.notify_one();
  }

 private:
  static constexpr size_t kMaxLines = 10000;
  LogQueue() { std::thread([this] { run(); }).detach(); }
  void run() {
    for (;;) {
      std::deque<std::string> batch;
      uint64_t dropped = 0;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return !lines_.empty() || dropped_ > 0; });
        batch.swap(lines_);
        std::swap(dropped, dropped_);
      }
      std::string out;
      for (auto& l : batch) out += l;
      if (dropped) out += fmt::format("{{\"event\":\"log_dropped\",\"lines\":{}}}\n", dropped);
      std::fwrite(out.data(), 1, out.size(), stderr);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> lines_;
  uint64_t dropped_ = 0;
};

void log_line(const nlohmann::json& j) {
  LogQueue::get().push(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// The connection's byte stream for httplib. It lives as long as the connection, so bytes
// read past the end of one request (a pipelined next request) stay buffered for the next.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(int fd, const GuardOptions& g)
      : fd_(fd), read_ms_(g.read_timeout_s * 1000), write_ms_(g.write_timeout_s * 1000), body_s_(g.body_timeout_s) {}

  bool is_readable() const override { return buffered() > 0 || wait_fd(fd_, POLLIN, read_ms_) > 0; }
  // As httplib's SocketStream: writable and the peer has not closed (a client gone away
  // must be noticed by streams that poll this between chunks).
  bool is_writable() const override {
    if (wait_fd(fd_, POLLOUT, write_ms_) <= 0) return false;
    if (buffered() > 0 || wait_fd(fd_, POLLIN, 0) == 0) return true;
    char c;
    return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (budget_ == 0) return -1;  // the body is larger than the payload cap
    if (buffered() == 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(body_deadline_ - Clock::now()).count();
      if (left <= 0) {  // the error handler turns httplib's 400 into a 408 naming the limit
        if (tl_record) tl_record->body_timed_out = true;
        errno = ETIMEDOUT;
        return -1;
      }
      if (on_body_wait && !on_body_wait(true)) return evicted();
      ssize_t n = fill(int(std::min<int64_t>(read_ms_, left)));
      if (on_body_wait && !on_body_wait(false)) return evicted();
      // (poll's millisecond rounding may wake it just before the deadline itself)
      if (n < 0 && errno == ETIMEDOUT && left <= read_ms_ && tl_record) tl_record->body_timed_out = true;
      if (n <= 0) return n;
    }
    size_t k = std::min({size, buffered(), budget_});
    std::memcpy(ptr, buf_.data() + off_, k);
    off_ += k;
    budget_ -= k;
    consumed_ += k;
    return ssize_t(k);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (wait_fd(fd_, POLLOUT, write_ms_) <= 0) return -1;
    for (;;) {
      ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { addr(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { addr(false, ip, port); }
  socket_t socket() const override { return fd_; }

  size_t buffered() const { return buf_.size() - off_; }

  // Reads until the end of the header block. 0: ok (head_len set); 1: peer closed before
  // any byte; 2: deadline; 3: too large; 4: error.
  int read_head(Clock::time_point deadline, size_t max_bytes, size_t& head_len) {
    for (;;) {
      // Empty lines before a request line are ignored (RFC 9112 2.2).
      while (buffered() >= 2 && buf_[off_] == '\r' && buf_[off_ + 1] == '\n') off_ += 2;
      std::string_view v(buf_.data() + off_, buffered());
      size_t e = v.find("\r\n\r\n");
      if (e != std::string_view::npos) {
        head_len = e + 4;
        return head_len > max_bytes ? 3 : 0;
      }
      if (v.size() > max_bytes) return 3;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return 2;
      ssize_t n = fill(int(left));
      if (n == 0) return buffered() == 0 ? 1 : 4;
      if (n < 0) return errno == ETIMEDOUT ? 2 : 4;
    }
  }
  std::string_view head(size_t len) const { return {buf_.data() + off_, len}; }
  void insert_after_request_line(const std::string& line) {
    size_t nl = std::string_view(buf_.data() + off_, buffered()).find('\n');
    buf_.insert(off_ + nl + 1, line);
  }
  void begin_request(size_t budget) {
    budget_ = budget;
    consumed_ = 0;
    body_deadline_ = Clock::now() + std::chrono::seconds(body_s_);
  }
  size_t consumed() const { return consumed_; }

  // Told true before and false after each wait for body bytes (the connection may be evicted
  // only while it waits); returns false once the connection was evicted.
  std::function<bool(bool)> on_body_wait;

 private:
  ssize_t evicted() {
    if (tl_record) tl_record->evicted = true;  // the error handler answers 503, not httplib's 400
    errno = ECONNRESET;
    return -1;
  }
  // One recv into the buffer; >0 bytes, 0 EOF, -1 error or timeout (errno ETIMEDOUT).
  ssize_t fill(int timeout_ms) {
    if (off_ > 0 && off_ == buf_.size()) buf_.clear(), off_ = 0;
    int w = wait_fd(fd_, POLLIN, timeout_ms);
    if (w == 0) errno = ETIMEDOUT;
    if (w <= 0) return -1;
    char tmp[16384];
    for (;;) {
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        if (off_ > (size_t(1) << 20)) buf_.erase(0, off_), off_ = 0;
        buf_.append(tmp, size_t(n));
      }
      return n;
    }
  }
  void addr(bool peer, std::string& ip, int& port) const {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if ((peer ? ::getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len)
              : ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len)) != 0)
      return;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(serv);
    }
  }

  int fd_;
  int read_ms_, write_ms_;
  int body_s_;
  Clock::time_point body_deadline_ = Clock::time_point::max();
  std::string buf_;
  size_t off_ = 0;
  size_t budget_ = SIZE_MAX, consumed_ = 0;
};

struct Refusal {
  int status;
  std::string message;
};

const char* reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    default: return "Service Unavailable";
  }
}

// A refusal written by the connection layer itself; the connection is closed after it.
void write_refusal(ConnStream& s, const Refusal& r) {
  nlohmann::json body = {{"error", {{"message", r.message}, {"type", r.status == 503 ? "server_error" : "invalid_request_error"},
                                    {"param", nullptr}, {"code", r.status}}}};
  const std::string b = body.dump();
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
                                "Connection: close\r\n{}\r\n{}",
                                r.status, reason(r.status), b.size(), r.status == 503 ? "Retry-After: 1\r\n" : "", b);
  s.write(out.data(), out.size());
}

struct Framing {
  std::optional<uint64_t> content_length;
  bool chunked = false;
};

// The header block's framing rules (the ones httplib gets wrong, see http_guard.h).
std::optional<Refusal> check_head(std::string_view head, const GuardOptions& g, Framing& f, bool& needs_length) {
  const size_t eol = head.find('\n');
  const std::string_view line = trim(head.substr(0, eol));
  const std::string method(line.substr(0, line.find(' ')));
  std::string_view rest = head.substr(eol + 1);
  while (!rest.empty()) {
    const size_t e = rest.find('\n');
    const std::string_view h = trim(rest.substr(0, e));
    rest = e == std::string_view::npos ? std::string_view() : rest.substr(e + 1);
    if (h.empty()) break;
    const size_t c = h.find(':');
    if (c == std::string_view::npos) continue;  // httplib answers malformed lines itself
    const std::string name = lower(trim(h.substr(0, c)));
    const std::string_view value = trim(h.substr(c + 1));
    if (name == "content-length") {
      if (value.empty() || value.size() > 19 || !std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        return Refusal{400, fmt::format("invalid Content-Length '{}'", value.substr(0, 40))};
      const uint64_t n = std::stoull(std::string(value));
      if (f.content_length && *f.content_length != n)
        return Refusal{400, "conflicting Content-Length headers"};
      f.content_length = n;
    } else if (name == "transfer-encoding") {
      if (lower(value) != "chunked")
        return Refusal{400, fmt::format("unsupported Transfer-Encoding '{}' (only chunked)", value.substr(0, 40))};
      f.chunked = true;
    } else if (name == "content-encoding" && lower(value) != "identity") {
      return Refusal{415, fmt::format("Content-Encoding '{}' is not accepted: send the request body uncompressed",
                                      value.substr(0, 40))};
    }
  }
  if (f.chunked && f.content_length) return Refusal{400, "both Transfer-Encoding and Content-Length given"};
  if (f.content_length && *f.content_length > g.max_body_bytes)
    return Refusal{413, fmt::format("request body of {} bytes exceeds the limit of {} bytes", *f.content_length, g.max_body_bytes)};
  needs_length = !f.chunked && !f.content_length && (method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE");
  return std::nullopt;
}

}  // namespace

RequestRecord* current_request() { return tl_record; }

int GuardedServer::bind_exclusive(const std::string& host, int port, int backlog) {
  // SO_REUSEADDR only: rebinding over TIME_WAIT is fine, sharing a live listener is not.
  set_socket_options([](socket_t s) {
    int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  int bound = port;
  if (port == 0) {
    bound = bind_to_any_port(host);
    if (bound < 0) return -1;
  } else if (!bind_to_port(host, port)) {
    return -1;
  }
  // httplib's listen backlog is compiled in as 5: listen again with a real one.
  if (::listen(svr_sock_, backlog) != 0) return -1;
  return bound;
}

bool GuardedServer::admit(std::list<Slot>::iterator& me, int fd) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t live = 0;
  for (auto& s : slots_) live += s.phase != 3;
  if (g_.max_connections > 0 && live >= size_t(g_.max_connections)) {
    // Full: the oldest idle keep-alive connection makes room, else the connection that has
    // been sending its request the longest (headers, or a body it is blocked waiting for):
    // under a swarm of tricklers that is a swarm member, while a fresh request, which sends
    // its request at once, is the newest. Connections whose handler runs are never cut.
    auto victim = slots_.end();
    auto pick = [&](auto evictable) {
      for (auto it = slots_.begin(); it != slots_.end(); ++it)
        if (evictable(*it) && (victim == slots_.end() || it->since < victim->since)) victim = it;
    };
    pick([](const Slot& s) { return s.phase == 0; });
    if (victim == slots_.end()) pick([](const Slot& s) { return s.phase == 1 || (s.phase == 2 && s.waiting); });
    if (victim == slots_.end()) return false;
    // Read side only: its thread wakes at once (poll sees EOF) and can still write its 503.
    ::shutdown(victim->fd, SHUT_RD);
    victim->phase = 3;
    evicted_++;
  }
  me = slots_.insert(slots_.end(), Slot{fd, 1, false, Clock::now()});
  return true;
}

bool GuardedServer::set_phase(std::list<Slot>::iterator me, int phase) {
  std::lock_guard<std::mutex> lk(mu_);
  if (me->phase == 3) return false;  // evicted: stays so
  // Each phase starts the clock anew, but the body phase keeps the request's start: a
  // trickled request is as old as its first byte.
  if (phase != me->phase && phase != 2) me->since = Clock::now();
  me->phase = phase;
  me->waiting = false;
  return true;
}

bool GuardedServer::set_waiting(std::list<Slot>::iterator me, bool waiting) {
  std::lock_guard<std::mutex> lk(mu_);
  if (me->phase == 3) return false;
  me->waiting = waiting;
  return true;
}

void GuardedServer::leave(std::list<Slot>::iterator me) {
  std::lock_guard<std::mutex> lk(mu_);
  slots_.erase(me);
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  open_++;
  ConnStream strm(sock, g_);
  std::list<Slot>::iterator me;
  auto refuse = [&](const Refusal& r, const char* method, const std::string& path) {
    write_refusal(strm, r);
    if (g_.log_requests)
      log_line({{"event", "request"}, {"method", method}, {"path", path}, {"status", r.status}, {"error", r.message}});
  };
  const Refusal evicted{503, fmt::format("connection closed to make room: the server is at its connection limit ({}) "
                                         "and this request had been arriving the longest; retry later",
                                         g_.max_connections)};
  if (!admit(me, sock)) {
    refused_++;
    refuse({503, fmt::format("too many connections (limit {}); retry later", g_.max_connections)}, "", "");
  } else {
    strm.on_body_wait = [this, me](bool waiting) { return set_waiting(me, waiting); };
    size_t count = keep_alive_max_count_;
    while (svr_sock_ != INVALID_SOCKET && count > 0) {
      // A new connection gets its first request read even while draining (it is answered
      // 503, not cut); a kept-alive one is closed.
      const bool first = count == keep_alive_max_count_;
      // Idle between requests: wait for the next one in slices, so draining and stop() are
      // noticed. A new connection is not idle but reading its first request (admit): else a
      // fresh probe would be the first to go when the next connection needs room.
      if (!first && !set_phase(me, 0)) break;
      const auto idle_end = Clock::now() + std::chrono::seconds(g_.keep_alive_timeout_s);
      bool ready = strm.buffered() > 0;
      while (!ready && !(draining_ && !first) && svr_sock_ != INVALID_SOCKET && Clock::now() < idle_end)
        ready = wait_fd(sock, POLLIN, 200) != 0;  // readable, closed or error
      if (!ready) break;
      if (!set_phase(me, 1)) {
        // Evicted: a new connection is told why, as when refused at the cap; an idle
        // keep-alive one is just closed (a response there would answer no request).
        if (first) refuse(evicted, "", "");
        break;
      }
      size_t head_len = 0;
      const int hr = strm.read_head(Clock::now() + std::chrono::seconds(g_.header_timeout_s), g_.max_header_bytes, head_len);
      if (!set_phase(me, 1)) {  // evicted while its headers trickled in
        refuse(evicted, "", "");
        break;
      }
      if (hr == 2) refuse({408, fmt::format("request headers not received within {} s", g_.header_timeout_s)}, "", "");
      if (hr == 3) refuse({431, fmt::format("request headers exceed {} bytes", g_.max_header_bytes)}, "", "");
      if (hr != 0) break;
      Framing f;
      bool needs_length = false;
      const std::string_view head = strm.head(head_len);
      const std::string_view rl = head.substr(0, head.find('\r'));
      const std::string method(rl.substr(0, rl.find(' ')));
      const std::string path(rl.substr(std::min(rl.size(), method.size() + 1), rl.rfind(' ') - method.size() - 1));
      if (auto r = check_head(head, g_, f, needs_length)) {
        refuse(*r, method.c_str(), path);
        break;
      }
      if (needs_length) {
        strm.insert_after_request_line("Content-Length: 0\r\n");
        head_len += 19;
        f.content_length = 0;
      }
      const size_t body = f.chunked ? g_.max_body_bytes + g_.max_body_bytes / 8 + 65536 : f.content_length.value_or(0);
      strm.begin_request(head_len + body);
      if (!set_phase(me, 2)) {
        refuse(evicted, method.c_str(), path);
        break;
      }
      RequestRecord rec;
      const auto t0 = Clock::now();
      tl_record = &rec;
      in_request_++;
      const bool close_connection = count == 1 || draining_;
      bool closed = false;
      const bool ok = process_request(strm, close_connection, closed, nullptr);
      in_request_--;
      tl_record = nullptr;
      if (g_.log_requests) {
        nlohmann::json j = {{"event", "request"}, {"method", rec.method.empty() ? method : rec.method},
                            {"path", rec.path.empty() ? path : rec.path}, {"status", rec.status},
                            {"duration_s", std::chrono::duration<double>(Clock::now() - t0).count()}};
        if (!rec.id.empty()) j["id"] = rec.id;
        if (rec.prompt_tokens >= 0) j["prompt_tokens"] = rec.prompt_tokens;
        if (rec.completion_tokens >= 0) j["completion_tokens"] = rec.completion_tokens;
        if (rec.ttft_s >= 0) j["ttft_s"] = rec.ttft_s;
        if (!rec.error.empty()) j["error"] = rec.error;
        log_line(j);
      }
      // A body left (partly) unread cannot be told apart from the next request: close.
      const bool unread = f.content_length && strm.consumed() < head_len + *f.content_length;
      if (!ok || closed || close_connection || rec.close_after || unread) break;
      count--;
    }
    leave(me);
  }
  // Lingering close: a request refused with its body unread would otherwise make the kernel
  // answer the unread bytes with a reset, which can destroy our response before the client
  // reads it. Discard what arrives for a short, bounded while.
  ::shutdown(sock, SHUT_WR);
  const auto linger_end = Clock::now() + std::chrono::milliseconds(500);
  char sink[16384];
  size_t drained = 0;
  while (drained < (size_t(4) << 20) && Clock::now() < linger_end && wait_fd(sock, POLLIN, 100) > 0) {
    const ssize_t n = ::recv(sock, sink, sizeof(sink), MSG_DONTWAIT);
    if (n <= 0) break;
    drained += size_t(n);
  }
  ::close(sock);
  open_--;
  return true;
}

}  // namespace sala::server
