// Where a result came from: the commit and the command line, recorded in
// every JSON result the CLI writes.
#pragma once

#include <map>
#include <string>

namespace activekv::cli {

/// Remembers argv (call once from main).
void set_command_line(int argc, char** argv);
/// The command line as given, arguments shell-quoted where needed.
const std::string& command_line();
/// `git rev-parse HEAD` of the source tree, with "-dirty" if it has
/// uncommitted changes; "unknown" outside a git checkout.
std::string git_commit();
/// The ACTIVEKV_* variables of this process's environment (name -> value):
/// the A/B switches (ACTIVEKV_PDL, ACTIVEKV_LOOKAHEAD, ACTIVEKV_WEIGHT_LAYOUT,
/// ACTIVEKV_SPLIT_DEPTH, ...) change what runs without showing in the
/// command line, so a result records them beside it.
std::map<std::string, std::string> activekv_environment();

}  // namespace activekv::cli
