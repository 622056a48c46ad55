/* The part of cuVS's C API (26.08) that raft-cuvs binds: bindgen reads this file, with
 * include/stubs first on the include path (for cuda_runtime.h and dlpack/dlpack.h) and the cuVS
 * wheel's include directory after it. Regenerate with crates/raft-cuvs/bindings.sh. */
#include <cuvs/core/c_api.h>
#include <cuvs/core/dataset.h>
#include <cuvs/distance/distance.h>
#include <cuvs/neighbors/brute_force.h>
#include <cuvs/neighbors/cagra.h>
#include <cuvs/neighbors/common.h>
