"""A test-only Django app for a kind whose model and stored state change shape in one migration
(``tests/workflows/test_migrating_parked_state.py``; docs/authoring.md, "Migrations of stored state")."""
