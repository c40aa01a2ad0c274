#pragma once

// The nodes of an output's autograd graph, for tests that check which
// operations a model's forward recorded.

#include <torch/torch.h>

#include <set>
#include <vector>

namespace cohort::test {

// Every node reachable from output's grad_fn, each once: valid while
// output (which holds the graph) lives.
inline std::vector<torch::autograd::Node*> graphNodes(const at::Tensor& output) {
  std::vector<torch::autograd::Node*> todo{output.grad_fn().get()}, nodes;
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    nodes.push_back(n);
    for (const torch::autograd::Edge& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return nodes;
}

}  // namespace cohort::test
