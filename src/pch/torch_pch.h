// Precompiled header for every target that includes LibTorch. Parsing
// torch/torch.h costs ~15 s per file; precompiling it once brings a
// translation unit back to a few seconds.
#pragma once

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
