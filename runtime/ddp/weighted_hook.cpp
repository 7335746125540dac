// The batch-weighted all-reduce of `thrifty.runtime.ddp.reweight` as a C++
// DDP communication hook: each bucket multiplied by this rank's weight
// b_r / B (a 0-dim float32 tensor for float32 buckets, the double otherwise,
// as PyTorch casts a Python float), then summed over the process group, and
// the sum handed back to DDP in the work's own future -- the structure of
// PyTorch's built-in AllReduceCommHook (default_comm_hooks.cpp), with the
// weight in place of its division by the world size. Built on first use by
// `thrifty.runtime.ddp.native` (torch.utils.cpp_extension).
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace {

struct Weight {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  double weight;
  at::Tensor factor;  // the weight as a 0-dim float32 tensor
};

class WeightedAllreduce : public c10d::CppCommHookInterface<Weight> {
 public:
  explicit WeightedAllreduce(Weight state) : c10d::CppCommHookInterface<Weight>(std::move(state)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors = {bucket.getBufferRef()};
    if (tensors[0].scalar_type() == at::kFloat) {
      tensors[0].mul_(state_.factor);
    } else {
      tensors[0].mul_(state_.weight);
    }
    return state_.group->allreduce(tensors)->getFuture();
  }
};

void register_weighted_allreduce(py::object reducer, py::object group, double weight) {
  auto target = reducer.cast<std::shared_ptr<c10d::Reducer>>();
  auto pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  auto factor = torch::tensor(weight, torch::kFloat32);
  target->register_comm_hook(std::make_unique<WeightedAllreduce>(Weight{pg, weight, factor}));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_weighted_allreduce", &register_weighted_allreduce,
        "Install the batch-weighted all-reduce on a DDP reducer: (reducer, process group, weight)");
}
