"""The agent kinds agentops ships, each a plug-in package listed in AGENTOPS_AGENT_MODULES."""
