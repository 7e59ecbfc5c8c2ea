// Validation of Options: the ranges of settings.def and the rules that tie fields together.
#pragma once

#include "slipstream/engine/options.h"
#include "slipstream/engine/status.h"

namespace slipstream::engine {

// OK, or InvalidArgument naming the first setting that is out of its range or inconsistent
// with another (Engine::Open and Engine::ArenaSize refuse such options).
Status ValidateOptions(const Options& options);

}  // namespace slipstream::engine
