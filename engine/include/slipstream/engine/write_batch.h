// WriteBatch: puts and deletes applied atomically, with one LSN range and one log checksum.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace slipstream::engine {

using KeyspaceId = uint32_t;
using Lsn = uint64_t;

class WriteBatch {
 public:
  struct Op {
    bool is_delete;
    KeyspaceId keyspace;
    std::string key;
    std::string value;
  };

  void Put(KeyspaceId keyspace, std::string_view key, std::string_view value) {
    ops_.push_back(Op{false, keyspace, std::string(key), std::string(value)});
  }
  void Delete(KeyspaceId keyspace, std::string_view key) {
    ops_.push_back(Op{true, keyspace, std::string(key), {}});
  }
  void Clear() { ops_.clear(); }
  size_t Count() const { return ops_.size(); }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Op> ops_;
};

}  // namespace slipstream::engine
