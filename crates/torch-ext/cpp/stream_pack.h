// stream_pack.h: conversion between c10::cuda::CUDAStream and the plain
// EsperStream triple that crosses the C ABI by value.
#pragma once

#include "esper_torch_ext.h"

#include <c10/cuda/CUDAStream.h>

namespace esper {

inline EsperStream pack_stream(const c10::cuda::CUDAStream& stream) {
  const c10::StreamData3 data = stream.pack3();
  EsperStream out;
  out.stream_id = static_cast<int64_t>(data.stream_id);
  out.device_index = static_cast<int64_t>(data.device_index);
  out.device_type = static_cast<int64_t>(data.device_type);
  return out;
}

inline c10::cuda::CUDAStream unpack_stream(const EsperStream& stream) {
  TORCH_CHECK(stream.device_type == static_cast<int64_t>(c10::DeviceType::CUDA),
              "not a CUDA stream (device type ", stream.device_type, ")");
  return c10::cuda::CUDAStream::unpack3(static_cast<c10::StreamId>(stream.stream_id),
                                        static_cast<c10::DeviceIndex>(stream.device_index),
                                        c10::DeviceType::CUDA);
}

}  // namespace esper
