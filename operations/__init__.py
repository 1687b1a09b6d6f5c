"""This project's own pyinfra operations, one module per concern (as tasks/ and facts/)."""
