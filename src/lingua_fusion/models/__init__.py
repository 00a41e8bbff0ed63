"""Model backends behind one Protocol per task, and the registry that picks them."""
