/* The part of DLPack that cuVS 26.08's C API uses, for bindgen only (the cuVS wheel carries no
 * dlpack.h). cuVS 26.08 builds against DLPack 0.8 (cpp/cmake/thirdparty/get_dlpack.cmake:
 * CUVS_MIN_VERSION_dlpack 0.8) and its C API takes the unversioned DLManagedTensor, whose layout is
 * the same in DLPack 0.8 and 1.x (1.0 added DLManagedTensorVersioned beside it). Values and layout
 * as in dlpack.h v0.8; the generated layout tests check the sizes and offsets. */
#pragma once
#include <stdint.h>

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
