"""One object per watched job (docs/design.md "Per-job state in one place"): what the
daemon remembers of a job between ticks (its snapshots, window readings, last
verdict, pauses and their learned lengths, where its ranks' time went, its
verdicts over time). The daemon keeps a map of them; the judging itself stays
pure (judge/)."""
