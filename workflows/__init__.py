"""The durable workflow plane: models, transitions, engine, services and operator interfaces."""
