// An error a request gets back, in OpenAI's shape:
//   HTTP <status>, {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Thrown by the request parser and the scheduler's admission checks, caught
// by the HTTP layer (http_server.cpp), which writes it.
#pragma once

#include <stdexcept>
#include <string>

namespace activekv::serve {

struct ApiError : std::runtime_error {
  int status;         ///< HTTP status: 400, 401, 404, 405, 413, 429, 500, 503
  std::string type;   ///< "invalid_request_error", "authentication_error", "not_found_error", ...
  std::string param;  ///< the request field at fault; empty: null
  std::string code;   ///< e.g. "context_length_exceeded", "model_not_found"; empty: null

  ApiError(int status_, std::string message, std::string type_, std::string param_ = {}, std::string code_ = {})
      : std::runtime_error(std::move(message)),
        status(status_),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}

  /// 400 invalid_request_error naming `param`.
  static ApiError bad_request(std::string message, std::string param = {}, std::string code = {}) {
    return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
  }
};

/// The JSON body of `e` (one line).
std::string error_body(const ApiError& e);
/// The JSON body of an error with this status and message (type from the status).
std::string error_body(int status, const std::string& message);

}  // namespace activekv::serve
