pytest_plugins = ["agentops.kind.pytest_plugin"]
