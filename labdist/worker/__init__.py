"""What runs on workers: the Replica actor and the replica context step functions see."""
