// error.h: exception-to-message plumbing shared by every shim source file.
//
// ESPER_TRY / ESPER_CATCH wrap the body of each `extern "C"` entry point so a
// C++ exception (c10::Error from TORCH_CHECK, a CUDA error, std::bad_alloc...)
// becomes a returned message instead of unwinding into Rust, which would abort
// the process.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace esper {

// Returned when even the error message cannot be allocated. esper_free_string
// recognises it and does not free it.
extern char kOutOfMemoryMessage[];

inline char* make_error(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out == nullptr) {
    return kOutOfMemoryMessage;
  }
  std::memcpy(out, message.data(), message.size());
  out[message.size()] = '\0';
  return out;
}

// Copies a string for Rust to own (freed with esper_free_string).
inline char* copy_string(const std::string& text) { return make_error(text); }

}  // namespace esper

#define ESPER_TRY try {
#define ESPER_CATCH                                                        \
  }                                                                        \
  catch (const c10::Error& error) {                                        \
    return esper::make_error(error.what_without_backtrace());              \
  }                                                                        \
  catch (const std::exception& error) {                                    \
    return esper::make_error(error.what());                                \
  }                                                                        \
  catch (...) {                                                            \
    return esper::make_error("unknown C++ exception");                     \
  }                                                                        \
  return nullptr;
