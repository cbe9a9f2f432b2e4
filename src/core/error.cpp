// Out-of-line raise so that the check macro stays small at every call site.
#include "core/error.h"

namespace tpdraft {

[[noreturn]] void throw_error(const char* /*file*/, int /*line*/, const std::string& message) {
  // The message is what a user acts on; file:line of the check adds nothing for them.
  throw Error(message);
}

[[noreturn]] void throw_input_error(const std::string& message) { throw InputError(message); }

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace tpdraft
