#pragma once

// What a call throws, as text, for tests of error messages.

#include <exception>
#include <string>
#include <type_traits>

namespace cohort::test {

// The message of the exception `f` throws, if it is an `E`; "WRONG EXCEPTION
// TYPE: <message>" for another exception; "NO ERROR" when it returns. Tests
// assert on the text, so each outcome fails a check for the expected message.
template <class E = std::exception, class F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if constexpr (std::is_same_v<E, std::exception>) {
      return e.what();
    } else {
      if (dynamic_cast<const E*>(&e) != nullptr) return e.what();
      return std::string("WRONG EXCEPTION TYPE: ") + e.what();
    }
  }
  return "NO ERROR";
}

}  // namespace cohort::test
