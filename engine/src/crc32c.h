// CRC32C: public (slipstream/engine/crc32c.h), since replication checks its frames with it.
#pragma once

#include "slipstream/engine/crc32c.h"
