// BackgroundSignal: see background_signal.h.
#include "background_signal.h"

namespace slipstream::engine {

void BackgroundSignal::Format() {
  mu_->Init();
  cv_->Init();
}

void BackgroundSignal::Wake() {
  SharedLock lock(mu_);
  pending_->store(1);
  cv_->NotifyAll();
}

void BackgroundSignal::NotifyProgress() {
  SharedLock lock(mu_);
  cv_->NotifyAll();
}

void BackgroundSignal::WaitForWork(int timeout_ms) {
  SharedLock lock(mu_);
  if (pending_->load() == 0) cv_->WaitFor(mu_, timeout_ms);
  pending_->store(0);
}

void BackgroundSignal::WakeAndWait(int timeout_ms) {
  SharedLock lock(mu_);
  pending_->store(1);
  cv_->NotifyAll();
  cv_->WaitFor(mu_, timeout_ms);
}

}  // namespace slipstream::engine
