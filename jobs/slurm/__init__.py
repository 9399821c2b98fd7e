"""Slurm as a pool's backend: its REST client (rest), what its job states and reasons mean in the console's
words (states), and the batch job a console job becomes (batch). Plain values in and out: no database here."""
