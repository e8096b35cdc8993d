#include <cstdlib>
#include "provenance.h"

#include <cstdio>
#include <memory>
#include <unistd.h>  // environ

namespace activekv::cli {
namespace {

std::string g_command;

std::string run(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return "";
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p.get())) out += buf;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string quote(const std::string& a) {
  if (!a.empty() && a.find_first_of(" \t\"'\\$`") == std::string::npos) return a;
  std::string q = "'";
  for (char c : a) {
    if (c == '\'') {
      q.append("'\\''");
    } else {
      q.push_back(c);
    }
  }
  q.push_back('\'');
  return q;
}

}  // namespace

void set_command_line(int argc, char** argv) {
  g_command.clear();
  for (int i = 0; i < argc; ++i) {
    if (i) g_command.push_back(' ');
    g_command.append(quote(argv[i]));
  }
}

const std::string& command_line() { return g_command; }

std::map<std::string, std::string> activekv_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (kv.rfind("ACTIVEKV_", 0) == 0 && eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string git_commit() {
  // A copied tree (the GPU machine) may carry a stale .git: the caller names the commit.
  if (const char* c = std::getenv("AKV_COMMIT"); c && *c) return c;
  const std::string dir = quote(ACTIVEKV_SOURCE_DIR);
  const std::string head = run("git -C " + dir + " rev-parse HEAD 2>/dev/null");
  if (head.empty()) return "unknown";
  const std::string dirty = run("git -C " + dir + " status --porcelain --untracked-files=no 2>/dev/null");
  return dirty.empty() ? head : head + "-dirty";
}

}  // namespace activekv::cli
