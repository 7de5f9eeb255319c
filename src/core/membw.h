// Measured host memory bandwidth: the roofline that CPU decode is held against.
#pragma once

namespace shardlm {

// Best of a few threaded copies of a buffer far larger than the caches, in GB/s (1e9 bytes/s),
// counting bytes read plus bytes written.
double measure_copy_gbps();

}  // namespace shardlm
