/* Stand-in for the CUDA runtime header, for bindgen only: cuVS's C headers use just these two
 * types (and size_t) from it. No CUDA toolkit is needed to regenerate the bindings. */
#pragma once
#include <stddef.h> /* size_t, which cuVS's headers get through the real one */
typedef struct CUstream_st* cudaStream_t;
typedef unsigned int cudaDataType_t;
