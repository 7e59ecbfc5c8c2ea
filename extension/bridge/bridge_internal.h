// bridge_internal.h: what the C++ bridges share behind their C interfaces (never included by
// C code).
#pragma once

#include "slipstream/engine/engine.h"

// This process's handle on the shared engine (nullptr before ss_open).
slipstream::engine::Engine* ss_bridge_engine();
