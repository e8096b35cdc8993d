// Where a result came from: the commit and the command line, recorded in
// every JSON result the CLI writes.
#pragma once

#include <string>

namespace activekv::cli {

/// Remembers argv (call once from main).
void set_command_line(int argc, char** argv);
/// The command line as given, arguments shell-quoted where needed.
const std::string& command_line();
/// `git rev-parse HEAD` of the source tree, with "-dirty" if it has
/// uncommitted changes; "unknown" outside a git checkout.
std::string git_commit();

}  // namespace activekv::cli
