// Declarations only; see gloo_decl/README.md.
#pragma once
#include <chrono>
namespace gloo {
// c10d's header calls setTimeout through a std::shared_ptr<Context> in an
// inline override whose code libtorch already compiled; the shim never
// creates, sizes or copies a Context.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
