// net/curve.cpp — CurveZMQ key files and the ZAP handler that enforces the
// allow-list.
//
// A key directory holds node.key (this node's secret key, mode 0600),
// node.pub (its public key) and allowed (the public keys that may connect,
// one per line). All keys are Z85 text, as zmq_curve_keypair produces them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <spdlog/spdlog.h>
#include <zmq.h>

#include "net/zmq_detail.hpp"
#include "net/zmq_transport.hpp"

namespace corolla::net {

namespace fs = std::filesystem;

namespace detail {

bool is_z85_key(const std::string& text) {
  if (text.size() != 40) return false;
  std::uint8_t key[32];
  return zmq_z85_decode(key, text.c_str()) != nullptr;
}

std::string z85_of_key(const std::uint8_t* key32) {
  char text[41];
  if (zmq_z85_encode(text, key32, 32) == nullptr) return {};
  return std::string(text, 40);
}

}  // namespace detail

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

/// The first word of each line of `path` that is not blank or a comment,
/// paired with its 1-based line number. '#' is a Z85 digit, so a comment
/// starts with '#' at the beginning of a line or after a blank, never inside
/// a key ("KEY  # laptop of X" is a key with a comment).
std::vector<std::pair<int, std::string>> read_key_lines(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot read (" + std::strerror(errno) + ")");
  std::vector<std::pair<int, std::string>> lines;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    const auto blank = line.find_first_of(" \t");
    if (blank != std::string::npos) {
      const std::string rest = trim(line.substr(blank));
      if (!rest.empty() && rest[0] != '#')
        throw std::runtime_error(path.string() + ":" + std::to_string(number) +
                                 ": expected one key per line (a comment starts with '#')");
      line.resize(blank);
    }
    lines.emplace_back(number, line);
  }
  if (in.bad()) throw std::runtime_error(path.string() + ": read error");
  return lines;
}

/// The single key in a key file (node.key / node.pub).
std::string read_single_key(const fs::path& path, const char* what) {
  const auto lines = read_key_lines(path);
  if (lines.size() != 1 || !detail::is_z85_key(lines[0].second))
    throw std::runtime_error(path.string() + ": expected exactly one " + what +
                             " (40 Z85 characters, as written by zmq_curve_keypair)");
  return lines[0].second;
}

/// Writes `text` to a new file created with `mode` (never widening the mode
/// of an existing file: a secret key must not be readable by others even for
/// an instant).
void write_new_file(const fs::path& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error(path.string() + ": cannot create (" + std::strerror(errno) + ")");
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(path.string() + ": write failed (" + std::strerror(err) + ")");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) throw std::runtime_error(path.string() + ": write failed (" + std::strerror(errno) + ")");
}

std::string public_of_secret(const std::string& secret) {
  char pub[41];
  if (zmq_curve_public(pub, secret.c_str()) != 0)
    throw std::runtime_error(detail::zmq_error_text("zmq_curve_public"));
  return std::string(pub, 40);
}

}  // namespace

curve_options load_curve_dir(const std::string& dir_text) {
  if (!zmq_has("curve"))
    throw std::runtime_error("CurveZMQ is not available: this libzmq was built without CURVE support");
  const fs::path dir(dir_text);
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) throw std::runtime_error(dir.string() + ": cannot create key directory (" + ec.message() + ")");
    fs::permissions(dir, fs::perms::owner_all, ec);
  } else if (!fs::is_directory(dir, ec)) {
    throw std::runtime_error(dir.string() + ": not a directory (expected a CurveZMQ key directory)");
  }

  const fs::path secret_path = dir / "node.key", public_path = dir / "node.pub",
                 allowed_path = dir / "allowed";
  curve_options c;
  c.enabled = true;
  const bool have_secret = fs::exists(secret_path, ec), have_public = fs::exists(public_path, ec);
  if (!have_secret && have_public)
    throw std::runtime_error(secret_path.string() + ": missing while " + public_path.string() +
                             " exists (the secret key cannot be recovered from the public one)");
  if (!have_secret) {
    char pub[41], sec[41];
    if (zmq_curve_keypair(pub, sec) != 0)
      throw std::runtime_error(detail::zmq_error_text("zmq_curve_keypair"));
    c.public_key.assign(pub, 40);
    c.secret_key.assign(sec, 40);
    write_new_file(secret_path, "# corolla CurveZMQ secret key of this node: keep private\n" + c.secret_key + "\n",
                   0600);
    write_new_file(public_path, "# corolla CurveZMQ public key of this node\n" + c.public_key + "\n", 0644);
    spdlog::info("curve: created a key pair in {} (public key {})", dir.string(), c.public_key);
  } else {
    struct stat st {};
    if (::stat(secret_path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
      spdlog::warn("curve: {} is readable by group or others (mode {:o}); chmod 600 it",
                   secret_path.string(), st.st_mode & 0777);
    c.secret_key = read_single_key(secret_path, "secret key");
    c.public_key = public_of_secret(c.secret_key);
    if (have_public) {
      if (read_single_key(public_path, "public key") != c.public_key)
        throw std::runtime_error(public_path.string() + ": does not match the secret key in " +
                                 secret_path.string());
    } else {
      write_new_file(public_path, "# corolla CurveZMQ public key of this node\n" + c.public_key + "\n", 0644);
    }
  }

  if (!fs::exists(allowed_path, ec)) {
    // Nodes sharing one key directory (one machine, one cluster) can reach
    // each other out of the box; other peers are added by hand.
    write_new_file(allowed_path,
                   "# Public keys (Z85) of the peers allowed to connect to this node, one per line.\n" +
                       c.public_key + "  # this node\n",
                   0644);
  }
  for (const auto& [number, key] : read_key_lines(allowed_path)) {
    if (!detail::is_z85_key(key))
      throw std::runtime_error(allowed_path.string() + ":" + std::to_string(number) + ": \"" + key +
                               "\" is not a 40-character Z85 public key");
    c.allowed.push_back(key);
  }
  return c;
}

bool is_curve_key(const std::string& text) { return detail::is_z85_key(text); }

// ---- ZAP handler --------------------------------------------------------------

namespace detail {

zap_handler::zap_handler(const std::vector<std::string>& allowed_z85,
                         std::function<void(const std::string&)> on_refusal)
    : allowed_(allowed_z85.begin(), allowed_z85.end()), on_refusal_(std::move(on_refusal)) {}

zap_handler::~zap_handler() {
  if (socket_) {
    int zero = 0;
    zmq_setsockopt(socket_, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(socket_);
  }
}

std::string zap_handler::bind(void* context) {
  socket_ = zmq_socket(context, ZMQ_REP);
  if (!socket_) return zmq_error_text("ZAP handler socket");
  set_int_option(socket_, ZMQ_LINGER, 0);
  // The endpoint libzmq sends ZAP requests to (RFC 27), per context.
  if (zmq_bind(socket_, "inproc://zeromq.zap.01") != 0) return zmq_error_text("bind inproc://zeromq.zap.01");
  return {};
}

void zap_handler::serve_pending() {
  std::vector<std::string> request;
  while (true) {
    request.clear();
    // A request is one multi-part message; REP has already removed the
    // envelope. Frames arrive together (atomic delivery), so only the first
    // receive can find nothing.
    bool more = true;
    while (more) {
      zmq_msg_t part;
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, socket_, request.empty() ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(&part);
        if (request.empty()) return;  // EAGAIN: nothing pending
        spdlog::error("{}", zmq_error_text("ZAP handler: receiving a request"));
        return;
      }
      request.emplace_back(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
      more = zmq_msg_more(&part) != 0;
      zmq_msg_close(&part);
    }
    serve_one(request);
  }
}

void zap_handler::serve_one(std::vector<std::string>& request) {
  // Request: version, request id, domain, address, routing id, mechanism,
  // credentials... Reply: version, request id, status code, status text,
  // user id, metadata.
  std::string status = "200", text = "OK", user_id;
  const std::string request_id = request.size() > 1 ? request[1] : std::string();
  std::string key = "?", address = request.size() > 3 ? request[3] : std::string("?");
  if (request.size() < 6 || request[0] != "1.0") {
    status = "500";
    text = "malformed ZAP request";
    spdlog::error("curve: malformed ZAP request ({} frames)", request.size());
  } else if (request[5] != "CURVE" || request.size() != 7 || request[6].size() != 32) {
    status = "400";
    text = "only CURVE clients are accepted";
    key = request[5] + " client";
  } else {
    key = z85_of_key(reinterpret_cast<const std::uint8_t*>(request[6].data()));
    if (allowed_.count(key)) {
      user_id = key;
    } else {
      status = "400";
      text = "public key not in the allow-list";
    }
  }
  if (status != "200") {
    ++refusals_;
    const std::string reason = "refused " + key + " from " + address + ": " + text;
    auto& log = log_[key];
    const auto now = std::chrono::steady_clock::now();
    // A refused client keeps reconnecting (about once a second): log the
    // first refusal and then one line per 10 s per key, with the count.
    if (log.last == std::chrono::steady_clock::time_point{} || now - log.last >= std::chrono::seconds(10)) {
      if (log.suppressed > 0)
        spdlog::warn("curve: {} ({} more refusals of this key since the last line)", reason, log.suppressed);
      else
        spdlog::warn("curve: {}", reason);
      log.last = now;
      log.suppressed = 0;
    } else {
      ++log.suppressed;
    }
    if (log_.size() > 4096) log_.clear();  // bound the memory a key-spraying peer can take
    if (on_refusal_) {
      try {
        on_refusal_(reason);
      } catch (const std::exception& e) {
        spdlog::error("curve: on_auth_failure handler threw: {}", e.what());
      }
    }
  }
  const std::string reply[6] = {"1.0", request_id, status, text, user_id, ""};
  for (int i = 0; i < 6; ++i) {
    if (zmq_send(socket_, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0) < 0) {
      spdlog::error("{}", zmq_error_text("ZAP handler: sending a reply"));
      return;
    }
  }
}

}  // namespace detail

}  // namespace corolla::net
