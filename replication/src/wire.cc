// Encoding and strict decoding of the control messages (wire.h).
#include "slipstream/replication/wire.h"

#include <cstring>

namespace slipstream::replication {

namespace {

enum class Type : uint32_t {
  kHello = 1,
  kHelloOk,
  kOpen,
  kOpenOk,
  kClose,
  kCloseOk,
  kFlush,
  kFlushOk,
  kError,
  kJoin,
  kJoinOk,
};

// Appends little-endian fields.
class Writer {
 public:
  void U32(uint32_t v) { Put(&v, 4); }
  void U64(uint64_t v) { Put(&v, 8); }
  void Text(std::string_view s) {
    U32(uint32_t(s.size()));
    out_.append(s);
  }
  std::string Finish(Type type) {
    std::string m;
    uint32_t head[3] = {kWireMagic, uint32_t(type), uint32_t(out_.size())};
    m.append(reinterpret_cast<const char*>(head), sizeof(head));
    return m + out_;
  }

 private:
  void Put(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads fields, remembering any overrun.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  uint32_t U32() { return Get<uint32_t>(); }
  uint64_t U64() { return Get<uint64_t>(); }
  std::string Text(size_t max) {
    uint32_t n = U32();
    if (!ok_ || n > max || n > in_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // True when every field was there and nothing follows.
  bool Done() const { return ok_ && pos_ == in_.size(); }

 private:
  template <typename T>
  T Get() {
    T v{};
    if (!ok_ || in_.size() - pos_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

bool IsValidStream(uint32_t stream) {
  return stream >= 1 && stream <= 4;
}

const char* StreamName(uint32_t stream) {
  switch (StreamId(stream)) {
    case StreamId::kWal:
      return "wal";
    case StreamId::kEngineL0:
      return "engine_l0";
    case StreamId::kEngineLarge:
      return "engine_large";
    case StreamId::kEngineIndex:
      return "engine_index";
  }
  return "unknown";
}

bool IsValidName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength || name == "." || name == "..") return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

bool IsValidBufferSize(uint64_t size) {
  return size >= 64 * 1024 && size <= (1u << 30) && (size & (size - 1)) == 0;
}

std::string Encode(const Message& message) {
  Writer w;
  return std::visit(
      [&](const auto& m) -> std::string {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Hello>) {
          w.U64(m.system_id);
          w.U64(m.version);
          w.Text(m.primary);
          w.U32(m.timeline);
          return w.Finish(Type::kHello);
        } else if constexpr (std::is_same_v<T, HelloOk>) {
          w.U64(m.version);
          w.U32(m.buffer_size);
          w.U32(m.buffers);
          w.U64(m.resume);
          w.U64(m.index_resume);
          return w.Finish(Type::kHelloOk);
        } else if constexpr (std::is_same_v<T, Open>) {
          w.U32(m.stream);
          w.U64(m.sequence);
          w.U64(m.start);
          return w.Finish(Type::kOpen);
        } else if constexpr (std::is_same_v<T, OpenOk>) {
          w.U32(m.buffer);
          w.U64(m.addr);
          w.U64(m.length);
          w.U64(m.rkey);
          return w.Finish(Type::kOpenOk);
        } else if constexpr (std::is_same_v<T, Close>) {
          w.U32(m.buffer);
          w.U32(m.length);
          return w.Finish(Type::kClose);
        } else if constexpr (std::is_same_v<T, CloseOk>) {
          w.U32(m.buffer);
          return w.Finish(Type::kCloseOk);
        } else if constexpr (std::is_same_v<T, Flush>) {
          w.U32(m.buffer);
          w.U32(m.length);
          return w.Finish(Type::kFlush);
        } else if constexpr (std::is_same_v<T, FlushOk>) {
          w.U32(m.buffer);
          w.U32(m.durable);
          return w.Finish(Type::kFlushOk);
        } else if constexpr (std::is_same_v<T, Join>) {
          w.U64(m.system_id);
          w.U64(m.version);
          w.Text(m.primary);
          return w.Finish(Type::kJoin);
        } else if constexpr (std::is_same_v<T, JoinOk>) {
          w.U32(m.registered);
          return w.Finish(Type::kJoinOk);
        } else {
          w.U32(m.code);
          w.Text(m.message.substr(0, kMaxMessage - 32));
          return w.Finish(Type::kError);
        }
      },
      message);
}

Status Decode(std::string_view bytes, Message* message) {
  auto bad = [](const char* why) {
    return Status::InvalidArgument(std::string("bad message: ") + why);
  };
  if (bytes.size() < 12 || bytes.size() > kMaxMessage) return bad("size");
  uint32_t head[3];
  std::memcpy(head, bytes.data(), sizeof(head));
  if (head[0] != kWireMagic) return bad("magic");
  if (head[2] != bytes.size() - 12) return bad("length");
  Reader r(bytes.substr(12));
  switch (Type(head[1])) {
    case Type::kHello: {
      Hello m;
      m.system_id = r.U64();
      m.version = r.U64();
      m.primary = r.Text(kMaxNameLength);
      m.timeline = r.U32();
      if (!r.Done() || !IsValidName(m.primary)) return bad("hello");
      *message = m;
      return Status::OK();
    }
    case Type::kHelloOk: {
      HelloOk m;
      m.version = r.U64();
      m.buffer_size = r.U32();
      m.buffers = r.U32();
      m.resume = r.U64();
      m.index_resume = r.U64();
      if (!r.Done()) return bad("hello reply");
      *message = m;
      return Status::OK();
    }
    case Type::kOpen: {
      Open m;
      m.stream = r.U32();
      m.sequence = r.U64();
      m.start = r.U64();
      if (!r.Done() || !IsValidStream(m.stream)) return bad("open");
      *message = m;
      return Status::OK();
    }
    case Type::kOpenOk: {
      OpenOk m;
      m.buffer = r.U32();
      m.addr = r.U64();
      m.length = r.U64();
      m.rkey = r.U64();
      if (!r.Done()) return bad("open reply");
      *message = m;
      return Status::OK();
    }
    case Type::kClose: {
      Close m;
      m.buffer = r.U32();
      m.length = r.U32();
      if (!r.Done()) return bad("close");
      *message = m;
      return Status::OK();
    }
    case Type::kCloseOk: {
      CloseOk m;
      m.buffer = r.U32();
      if (!r.Done()) return bad("close reply");
      *message = m;
      return Status::OK();
    }
    case Type::kFlush: {
      Flush m;
      m.buffer = r.U32();
      m.length = r.U32();
      if (!r.Done()) return bad("flush");
      *message = m;
      return Status::OK();
    }
    case Type::kFlushOk: {
      FlushOk m;
      m.buffer = r.U32();
      m.durable = r.U32();
      if (!r.Done()) return bad("flush reply");
      *message = m;
      return Status::OK();
    }
    case Type::kJoin: {
      Join m;
      m.system_id = r.U64();
      m.version = r.U64();
      m.primary = r.Text(kMaxNameLength);
      if (!r.Done() || !IsValidName(m.primary)) return bad("join");
      *message = m;
      return Status::OK();
    }
    case Type::kJoinOk: {
      JoinOk m;
      m.registered = r.U32();
      if (!r.Done()) return bad("join reply");
      *message = m;
      return Status::OK();
    }
    case Type::kError: {
      Error m;
      m.code = r.U32();
      m.message = r.Text(kMaxMessage);
      if (!r.Done()) return bad("error");
      *message = m;
      return Status::OK();
    }
  }
  return bad("type");
}

}  // namespace slipstream::replication
