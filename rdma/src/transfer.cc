// Executing schedules: gather lists built from a schedule's boxes, posted to every target
// before any completion is awaited.
#include "slipstream/rdma/transfer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "small_copy.h"

namespace slipstream::rdma {

namespace {

using Clock = std::chrono::steady_clock;

// Work requests one target has in flight at once; the last of each batch is signaled.
constexpr size_t kBatchRequests = 16;
// Bytes one work request carries at most (Completion::byte_len is 32 bits).
constexpr uint64_t kMaxRequestBytes = uint64_t{1} << 30;

// The progress of one target through its schedule.
struct TargetState {
  size_t next_run = 0;
  uint64_t next_run_offset = 0;  // bytes of runs[next_run] already in earlier requests
  bool waiting = false;          // a batch is posted and its signaled request not yet complete
  bool done = false;
  uint64_t batch_id = 0;  // the wr_id of the batch's signaled request
  std::vector<Sge> sges;
  std::vector<WorkRequest> requests;
  std::vector<std::pair<size_t, size_t>> spans;
};

// Checks one target before anything is posted anywhere.
Status CheckTarget(const RegionTarget& t) {
  if (t.connection == nullptr || t.layout == nullptr || t.schedule == nullptr) {
    return Status::InvalidArgument("region target without a connection, layout or schedule");
  }
  const Schedule& schedule = *t.schedule;
  Status s = CheckSchedule(*t.layout, schedule, t.source.addr == nullptr ? 0 : t.source.length);
  if (!s.ok()) return s;
  if (schedule.packed_bytes > 0 &&
      (t.staging.addr == nullptr || t.staging.length < schedule.max_packed_run)) {
    return Status::InvalidArgument("the staging buffer cannot hold the largest packed run");
  }
  if (t.remote_offset > t.remote.length ||
      schedule.wire_bytes > t.remote.length - t.remote_offset) {
    return Status::InvalidArgument("the remote region cannot hold the wire image");
  }
  return Status::OK();
}

// Builds and posts the target's next batch: up to kBatchRequests requests of up to max_sge
// gather entries each, stopping early when the staging buffer is full. Packed runs are copied
// into staging here; the batch's last request is signaled. Where the connection has strided
// gathers and the schedule a packed period, the period's copies go as one request that
// gathers them straight from the source (no staging copy).
Status PostBatch(RegionTarget& t, TargetState& state, uint64_t batch_id, TransferStats* stats) {
  const Schedule& schedule = *t.schedule;
  const uint64_t boxes = schedule.box_count();
  const uint32_t max_sge = std::max<uint32_t>(1, t.connection->max_sge());
  const uint64_t period_runs = schedule.period_runs();
  const bool gather_periods = t.connection->max_repeat() > 1 && schedule.period_packed() &&
                              period_runs <= max_sge && schedule.period_wire_bytes > 0 &&
                              schedule.period_wire_bytes <= kMaxRequestBytes;
  // Whether box `i` starts a copy of the period that a strided gather sends.
  auto starts_gathered_copy = [&](uint64_t i) {
    return gather_periods && i >= schedule.period_first &&
           (i - schedule.period_first) % period_runs == 0;
  };
  state.sges.clear();
  state.requests.clear();
  std::vector<std::pair<size_t, size_t>>& spans = state.spans;  // per request: first, count
  spans.clear();
  uint64_t staged = 0;
  uint64_t request_bytes = 0;
  bool staging_full = false;
  bool last_was_staging = false;
  bool request_closed = false;  // the last request is a strided gather: nothing joins it
  while (state.next_run < boxes && !staging_full) {
    if (starts_gathered_copy(state.next_run)) {
      if (spans.size() == kBatchRequests) break;
      const uint64_t copy = (state.next_run - schedule.period_first) / period_runs;
      const uint64_t copies =
          std::min<uint64_t>({schedule.period_repeat - copy, t.connection->max_repeat(),
                              kMaxRequestBytes / schedule.period_wire_bytes});
      spans.emplace_back(state.sges.size(), period_runs);
      for (uint64_t j = 0; j < period_runs; j++) {
        const Run run = schedule.box(state.next_run + j);
        state.sges.push_back(Sge{t.source.addr + run.source, uint32_t(run.length), t.source.lkey});
      }
      WorkRequest wr;
      wr.opcode = Opcode::kWrite;
      wr.remote_addr = t.remote.addr + t.remote_offset + schedule.box(state.next_run).wire;
      wr.rkey = t.remote.rkey;
      wr.signaled = false;
      wr.repeat = uint32_t(copies);
      wr.repeat_stride = schedule.period_stride;
      state.requests.push_back(wr);
      if (stats) stats->gathered_bytes += copies * schedule.period_wire_bytes;
      state.next_run += copies * period_runs;
      request_closed = true;
      last_was_staging = false;
      continue;
    }
    const Run run = schedule.box(state.next_run);
    const uint64_t needs = run.packed ? run.length : 1;  // in-place runs may be split
    const bool new_request = request_closed || spans.empty() || spans.back().second == max_sge ||
                             request_bytes + needs > kMaxRequestBytes;
    if (new_request) {
      if (spans.size() == kBatchRequests) break;
      request_closed = false;
      request_bytes = 0;
      spans.emplace_back(state.sges.size(), 0);
      WorkRequest wr;
      wr.opcode = Opcode::kWrite;
      wr.remote_addr = t.remote.addr + t.remote_offset + run.wire + state.next_run_offset;
      wr.rkey = t.remote.rkey;
      wr.signaled = false;
      state.requests.push_back(wr);
      last_was_staging = false;
    }
    const uint64_t room = kMaxRequestBytes - request_bytes;
    if (run.packed) {
      // A stretch of packed runs becomes one entry: copy them back to back while they fit.
      const char* from = t.source.addr;
      char* const first = t.staging.addr + staged;
      char* at = first;
      const uint64_t limit = std::min(t.staging.length - staged,
                                      std::min(kMaxRequestBytes - request_bytes, kMaxBoxBytes));
      char* const end = first + limit;
      uint64_t next = state.next_run;
      for (; next < boxes && (next == state.next_run || !starts_gathered_copy(next)); next++) {
        const Run box = next == state.next_run ? run : schedule.box(next);
        if (!box.packed || box.length > uint64_t(end - at)) break;
        CopyFragment(at, from + box.source, box.length);
        at += box.length;
      }
      const uint64_t copied = uint64_t(at - first);
      if (copied == 0) {  // the next packed run does not fit what is left
        staging_full = true;
        break;
      }
      state.next_run = next;
      staged += copied;
      request_bytes += copied;
      if (stats) stats->packed_bytes += copied;
      Sge* previous = last_was_staging ? &state.sges.back() : nullptr;
      if (previous != nullptr && previous->length + copied <= kMaxBoxBytes) {
        previous->length += uint32_t(copied);
      } else {
        state.sges.push_back(Sge{first, uint32_t(copied), t.staging.lkey});
        spans.back().second++;
      }
      last_was_staging = true;
    } else {
      // An in-place run goes as one entry, or several when it exceeds what a request holds.
      const uint64_t piece =
          std::min<uint64_t>({run.length - state.next_run_offset, room, kMaxBoxBytes});
      state.sges.push_back(
          Sge{t.source.addr + run.source + state.next_run_offset, uint32_t(piece), t.source.lkey});
      spans.back().second++;
      last_was_staging = false;
      request_bytes += piece;
      state.next_run_offset += piece;
      if (state.next_run_offset == run.length) {
        state.next_run++;
        state.next_run_offset = 0;
      }
    }
  }
  // A request opened for a packed run that did not fit the staging buffer stays empty.
  while (!spans.empty() && spans.back().second == 0) {
    spans.pop_back();
    state.requests.pop_back();
  }
  if (state.requests.empty()) {
    if (state.next_run < boxes) {
      return Status::InvalidArgument("a packed run does not fit the staging buffer");
    }
    state.done = true;
    return Status::OK();
  }
  for (size_t i = 0; i < state.requests.size(); i++) {
    state.requests[i].sg_list = &state.sges[spans[i].first];
    state.requests[i].num_sge = uint32_t(spans[i].second);
    if (stats) {
      stats->pieces += spans[i].second;
      for (size_t j = 0; j < spans[i].second; j++) {
        stats->wire_bytes +=
            uint64_t(state.sges[spans[i].first + j].length) * state.requests[i].repeat;
      }
    }
  }
  state.requests.back().signaled = true;
  state.requests.back().wr_id = batch_id;
  if (stats) stats->requests += state.requests.size();
  Status s = t.connection->Post(state.requests.data(), state.requests.size());
  if (!s.ok()) return s;
  state.waiting = true;
  return Status::OK();
}

// Polls `connection` (waiting up to timeout_ms for the first completion) and ends the batch
// of whichever target a completion names by its wr_id: targets may share a connection.
Status Reap(Connection* connection, std::vector<TargetState>& states, int timeout_ms,
            bool* progressed) {
  Completion completions[8];
  size_t count = 0;
  Status s = connection->Poll(completions, 8, timeout_ms, &count);
  for (size_t i = 0; i < count; i++) {
    if (completions[i].status != WcStatus::kSuccess) {
      return Status::RemoteAccess("a region write failed at the target");
    }
    for (TargetState& state : states) {
      if (state.waiting && state.batch_id == completions[i].wr_id) {
        state.waiting = false;
        *progressed = true;
      }
    }
  }
  if (!s.ok() && count == 0) return s;
  return Status::OK();
}

// True when two targets would copy packed boxes into overlapping staging memory.
bool StagingOverlaps(const RegionTarget* targets, size_t count) {
  for (size_t i = 0; i < count; i++) {
    const RegionTarget& a = targets[i];
    if (a.schedule->packed_bytes == 0) continue;
    for (size_t j = i + 1; j < count; j++) {
      const RegionTarget& b = targets[j];
      if (b.schedule->packed_bytes == 0) continue;
      if (a.staging.addr < b.staging.addr + b.staging.length &&
          b.staging.addr < a.staging.addr + a.staging.length) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

Status ScatterRegions(RegionTarget* targets, size_t count, int timeout_ms, TransferStats* stats) {
  for (size_t i = 0; i < count; i++) {
    Status s = CheckTarget(targets[i]);
    if (!s.ok()) return s;
  }
  if (StagingOverlaps(targets, count)) {
    return Status::InvalidArgument("targets share staging memory");
  }
  std::vector<TargetState> states(count);
  uint64_t batch_id = 0;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    bool progressed = false;
    bool all_done = true;
    for (size_t i = 0; i < count; i++) {
      TargetState& state = states[i];
      if (state.waiting) {
        Status s = Reap(targets[i].connection, states, 0, &progressed);
        if (!s.ok()) return s;
      }
      if (!state.waiting && !state.done) {
        state.batch_id = ++batch_id;
        Status s = PostBatch(targets[i], state, batch_id, stats);
        if (!s.ok()) return s;
        progressed = true;
      }
      all_done = all_done && state.done;
    }
    if (all_done) return Status::OK();
    if (progressed) {
      deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
      continue;
    }
    if (Clock::now() >= deadline) return Status::Timeout("region writes did not complete");
    // Nothing moved: sleep in the first waiting target's transport for a moment.
    for (size_t i = 0; i < count; i++) {
      if (states[i].waiting) {
        Status s = Reap(targets[i].connection, states, 1, &progressed);
        if (!s.ok()) return s;
        break;
      }
    }
  }
}

}  // namespace slipstream::rdma
