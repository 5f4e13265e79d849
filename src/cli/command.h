// Subcommands of `sala` register themselves: each src/cli/cmd_*.cpp defines one
//   static sala::cli::Registrar reg("name", "help", setup);
// where setup(app) adds the options and returns the function to run (exit status).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace sala::cli {

using Run = std::function<int()>;
using Setup = std::function<Run(CLI::App&)>;

struct Command {
  std::string name, help;
  Setup setup;
};

std::vector<Command>& registry();

struct Registrar {
  Registrar(std::string name, std::string help, Setup setup) {
    registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace sala::cli
