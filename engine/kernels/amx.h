// AMX tiles, shared by the kernels that use them (packed_linear_cpu.cpp, prefill_tiles_amx.h).
//
// Every tile these kernels use is 16 rows of 64 bytes: a C tile 16 x 16 float32 sums, an A tile 16 rows
// of 32 bf16 values, a B tile 16 pairs of rows of 16 bf16 columns (the pair layout a dot product of
// pairs reads).  A tile multiply-add sums each element of C from its row of A alone, so a row's result
// never depends on what the other rows of the tile hold.
#pragma once

#include <cstdint>

namespace kvchat {
constexpr int64_t kTileRows = 16;
constexpr int64_t kTileInputs = 32;  // bf16 values in a row of an A tile
}  // namespace kvchat

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kvchat {

// Linux lends a process AMX's tile data only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
inline bool amx_permitted() {
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return permitted;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-7, each 16 rows of 64 bytes; a thread configures them before its first tile instruction.
inline void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = kTileRows;
  }
  _tile_loadconfig(&config);
}

inline void release_tiles() { _tile_release(); }

}  // namespace kvchat

#else

namespace kvchat {
inline bool amx_permitted() { return false; }
inline void configure_tiles() {}
inline void release_tiles() {}
}  // namespace kvchat

#endif
