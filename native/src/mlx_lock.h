// MLX builds its graphs in shared state that is not safe across threads, so
// every call into MLX (a delegate's load, run and free, and the C interface's
// reads and writes of program state) holds this one lock.
#pragma once

#include <mutex>

namespace etmlx::native {

std::mutex& mlx_mutex();

}  // namespace etmlx::native
