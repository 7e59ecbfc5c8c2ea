// WriteBatch: puts and deletes applied atomically, with one LSN range and one log checksum.
//
// Keys and values are copied into one buffer, so building a batch of a thousand rows costs a
// few allocations, not two per row, and Clear() keeps that memory for the next batch: a bulk
// load writes batch after batch, and memory freed and allocated again each time was handed
// back to the system and faulted in anew (a fifth of a COPY's time in the backend).
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
  // One operation, as views into the batch (valid until the batch next changes).
  struct Op {
    bool is_delete;
    KeyspaceId keyspace;
    std::string_view key;
    std::string_view value;
    uint32_t changed_prefix;  // PutChangedPrefix's `prefix`; 0 for a plain put
  };

  void Put(KeyspaceId keyspace, std::string_view key, std::string_view value) {
    Add(false, keyspace, key, value);
  }
  // A put of a value that differs from the key's stored value only in its first `prefix`
  // bytes (at most 64; a row's header change). The caller guarantees that the rest is equal
  // and that the key is not written meanwhile. A large stored value is then not written
  // again: the entry names its record and keeps the new prefix. Otherwise, a plain put.
  void PutChangedPrefix(KeyspaceId keyspace, std::string_view key, std::string_view value,
                        uint32_t prefix) {
    Add(false, keyspace, key, value);
    entries_.back().changed_prefix = prefix;
  }
  void Delete(KeyspaceId keyspace, std::string_view key) { Add(true, keyspace, key, {}); }
  // Empties the batch; its memory stays for the next one.
  void Clear() {
    entries_.clear();
    data_.clear();
  }
  // Makes room for `ops` more operations whose keys and values take `bytes` in all.
  void Reserve(size_t ops, size_t bytes) {
    entries_.reserve(entries_.size() + ops);
    data_.reserve(data_.size() + bytes);
  }
  size_t Count() const { return entries_.size(); }
  // Bytes of keys and values held, and bytes the batch has room for (what Clear() keeps).
  size_t ByteSize() const { return data_.size(); }
  size_t Capacity() const { return data_.capacity() + entries_.capacity() * sizeof(Entry); }
  Op op(size_t i) const {
    const Entry& e = entries_[i];
    std::string_view data(data_);
    return Op{e.is_delete, e.keyspace, data.substr(e.offset, e.key_size),
              data.substr(e.offset + e.key_size, e.value_size), e.changed_prefix};
  }

 private:
  struct Entry {
    size_t offset;  // of the key in data_; the value follows it
    size_t key_size;
    size_t value_size;
    KeyspaceId keyspace;
    bool is_delete;
    uint32_t changed_prefix;
  };

  void Add(bool is_delete, KeyspaceId keyspace, std::string_view key, std::string_view value) {
    entries_.push_back(Entry{data_.size(), key.size(), value.size(), keyspace, is_delete, 0});
    data_.append(key);
    data_.append(value);
  }

  std::vector<Entry> entries_;
  std::string data_;
};

}  // namespace slipstream::engine
