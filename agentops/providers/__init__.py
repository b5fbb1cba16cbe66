"""The model providers agentops ships, each a class AGENTOPS_MODEL_PROVIDERS names: ``anthropic``
(the Messages API through the official SDK; chosen when ANTHROPIC_API_KEY is set) and ``scripted``
(offline, the default). Each implements ``workflows.provider.ModelProvider`` and builds itself with
``from_settings(model=…)``; ``answers`` holds the structured-answer helpers the shipped kinds use."""
