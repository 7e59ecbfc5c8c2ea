// The shuffle's C interface over rdma::Exchange (shuffle_bridge.h). Every entry point catches
// every exception: nothing C++ crosses into PostgreSQL.
#include "shuffle_bridge.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "slipstream/rdma/exchange.h"

namespace rdma = slipstream::rdma;

struct SsShuffle {
  std::string transport;
  std::string secret;
  std::unique_ptr<rdma::Listener> listener;
  std::unique_ptr<rdma::Exchange> exchange;
  std::vector<rdma::RegionLayout> per_peer;  // the staged batch: each peer's rows
  std::vector<uint64_t> rows_per_peer;
};

struct SsShuffleBatch {
  rdma::ExchangeMessage message;
  std::unique_ptr<rdma::LandingCursor> cursor;
};

namespace {

// Copies `text` into the caller's error buffer.
void SetError(char* error, const std::string& text) {
  if (error == nullptr) return;
  std::snprintf(error, SS_SHUFFLE_ERROR_SIZE, "%s", text.c_str());
}

// A failed status as a result code, its message in `error`.
int Fail(char* error, const rdma::Status& s) {
  SetError(error, s.message());
  return s.code() == rdma::Status::Code::kAuthFailed ? SS_SHUFFLE_AUTH_FAILED : SS_SHUFFLE_ERROR;
}

// Runs `body`, turning any exception into SS_SHUFFLE_ERROR with its text.
template <typename Body>
int Guard(char* error, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    SetError(error, std::string("internal error in the shuffle: ") + e.what());
  } catch (...) {
    SetError(error, "internal error in the shuffle");
  }
  return SS_SHUFFLE_ERROR;
}

}  // namespace

extern "C" SsShuffle* ss_shuffle_listen(const char* host, const char* transport, const char* secret,
                                        uint32_t* port, char* error) {
  SsShuffle* result = nullptr;
  Guard(error, [&] {
    auto shuffle = std::make_unique<SsShuffle>();
    shuffle->transport = transport;
    shuffle->secret = secret;
    rdma::TransportOptions options;
    options.backend = transport;
    options.secret = secret;
    rdma::Status s = rdma::Listen(options, std::string(host) + ":0", &shuffle->listener);
    if (!s.ok()) return Fail(error, s);
    const std::string address = shuffle->listener->address();
    *port = uint32_t(std::stoul(address.substr(address.rfind(':') + 1)));
    result = shuffle.release();
    return SS_SHUFFLE_OK;
  });
  return result;
}

extern "C" int ss_shuffle_connect(SsShuffle* shuffle, uint64_t id, uint32_t self,
                                  const char* const* addresses, uint32_t n,
                                  uint32_t receive_buffers, uint32_t buffer_size, int timeout_ms,
                                  char* error) {
  return Guard(error, [&] {
    rdma::ExchangeOptions options;
    options.transport.backend = shuffle->transport;
    options.transport.secret = shuffle->secret;
    options.transport.connect_timeout_ms = timeout_ms;
    options.channel.receive_buffers = receive_buffers;
    options.channel.receive_buffer_size = buffer_size;
    // One sender, two packages in flight: each part holds a whole Receive Buffer's package.
    options.channel.sender_threads = 1;
    options.channel.packages_in_flight = 2;
    options.channel.send_buffer_size = 2 * buffer_size;
    options.exchange_id = id;
    options.self = self;
    for (uint32_t i = 0; i < n; i++) options.addresses.emplace_back(addresses[i]);
    options.timeout_ms = timeout_ms;
    rdma::Status s = rdma::Exchange::Open(options, shuffle->listener.get(), &shuffle->exchange);
    if (!s.ok()) return Fail(error, s);
    shuffle->per_peer.resize(n);
    shuffle->rows_per_peer.assign(n, 0);
    return SS_SHUFFLE_OK;
  });
}

extern "C" uint64_t ss_shuffle_max_batch(const SsShuffle* shuffle) {
  return shuffle->exchange ? shuffle->exchange->max_batch_bytes() : 0;
}

extern "C" int ss_shuffle_set_source(SsShuffle* shuffle, uint32_t target, void* buffer,
                                     size_t length, char* error) {
  return Guard(error, [&] {
    rdma::Status s = shuffle->exchange->SetSourceFor(target, buffer, length);
    return s.ok() ? SS_SHUFFLE_OK : Fail(error, s);
  });
}

extern "C" int ss_shuffle_stage(SsShuffle* shuffle, uint32_t target, const uint32_t* lengths,
                                uint32_t rows, char* error) {
  return Guard(error, [&] {
    if (target >= shuffle->per_peer.size()) {
      SetError(error, "no participant " + std::to_string(target) + " in this shuffle");
      return SS_SHUFFLE_ERROR;
    }
    std::vector<rdma::Fragment> items(rows);
    uint64_t offset = 0;
    for (uint32_t i = 0; i < rows; i++) {
      items[i] = rdma::Fragment{offset, lengths[i]};
      offset += lengths[i];
    }
    rdma::Status s =
        rdma::RegionLayout::PointerMapped(std::move(items), &shuffle->per_peer[target]);
    if (!s.ok()) return Fail(error, s);
    shuffle->rows_per_peer[target] = rows;
    return SS_SHUFFLE_OK;
  });
}

extern "C" int ss_shuffle_try_send(SsShuffle* shuffle, uint32_t target, char* error) {
  return Guard(error, [&] {
    if (target >= shuffle->per_peer.size() || shuffle->rows_per_peer[target] == 0) {
      return SS_SHUFFLE_OK;
    }
    rdma::Exchange& exchange = *shuffle->exchange;
    rdma::Status s = exchange.TrySend(target, shuffle->per_peer[target],
                                      rdma::TransferCosts::Measured(exchange.backend(target)));
    if (s.code() == rdma::Status::Code::kWouldBlock) return SS_SHUFFLE_WOULD_BLOCK;
    if (!s.ok()) return Fail(error, s);
    shuffle->rows_per_peer[target] = 0;  // sent: a retry of the batch sends nothing twice
    return SS_SHUFFLE_OK;
  });
}

extern "C" int ss_shuffle_try_end(SsShuffle* shuffle, uint32_t target, char* error) {
  return Guard(error, [&] {
    rdma::Status s = shuffle->exchange->TryEnd(target);
    if (s.code() == rdma::Status::Code::kWouldBlock) return SS_SHUFFLE_WOULD_BLOCK;
    return s.ok() ? SS_SHUFFLE_OK : Fail(error, s);
  });
}

extern "C" int ss_shuffle_receive(SsShuffle* shuffle, int timeout_ms, SsShuffleBatch** batch,
                                  int* end_from, char* error) {
  *batch = nullptr;
  *end_from = -1;
  return Guard(error, [&] {
    auto received = std::make_unique<SsShuffleBatch>();
    rdma::Status s = shuffle->exchange->Receive(&received->message, timeout_ms);
    if (s.code() == rdma::Status::Code::kTimeout) return SS_SHUFFLE_NOTHING;
    if (!s.ok()) return Fail(error, s);
    if (received->message.end) {
      *end_from = int(received->message.from);
      return SS_SHUFFLE_OK;
    }
    received->cursor =
        std::make_unique<rdma::LandingCursor>(received->message.layout, received->message.options);
    *batch = received.release();
    return SS_SHUFFLE_OK;
  });
}

extern "C" bool ss_shuffle_all_ended(const SsShuffle* shuffle) {
  return shuffle->exchange == nullptr || shuffle->exchange->AllEnded();
}

extern "C" int ss_shuffle_finish(SsShuffle* shuffle, int timeout_ms, char* error) {
  return Guard(error, [&] {
    rdma::Status s = shuffle->exchange->Close(timeout_ms);
    return s.ok() ? SS_SHUFFLE_OK : Fail(error, s);
  });
}

extern "C" uint32_t ss_shuffle_batch_from(const SsShuffleBatch* batch) {
  return batch->message.from;
}

// The landing offsets were checked against the message when it arrived (WireBytes), so every
// row lies inside it.
extern "C" bool ss_shuffle_batch_next(SsShuffleBatch* batch, const char** data, uint32_t* length) {
  try {
    rdma::Fragment landed;
    if (!batch->cursor->Next(&landed)) return false;
    *data = batch->message.data.data() + batch->message.wire_offset + landed.offset;
    *length = uint32_t(landed.length);
    return true;
  } catch (...) {
    return false;
  }
}

extern "C" void ss_shuffle_batch_free(SsShuffleBatch* batch) {
  delete batch;
}

extern "C" void ss_shuffle_counters(const SsShuffle* shuffle, uint32_t peer, uint64_t out[6]) {
  rdma::ExchangeCounters c;
  if (shuffle->exchange && peer < shuffle->exchange->participants()) {
    c = shuffle->exchange->counters(peer);
  }
  out[0] = c.batches_sent;
  out[1] = c.payload_bytes_sent;
  out[2] = c.wire_bytes_sent;
  out[3] = c.batches_received;
  out[4] = c.payload_bytes_received;
  out[5] = c.wire_bytes_received;
}

extern "C" void ss_shuffle_close(SsShuffle* shuffle) {
  try {
    delete shuffle;
  } catch (...) {
  }
}
