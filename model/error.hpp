// model/error.hpp — the error type for bad user input at the model layer.
#pragma once

#include <stdexcept>

namespace corolla {

/// A problem with input the user gave us (a file, a config, ids): the
/// message is complete and is shown to the user as one line.
class model_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace corolla
