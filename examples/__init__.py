"""Agent kinds written from docs/authoring.md, kept in the repository and run by the tests."""
