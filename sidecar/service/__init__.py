"""Services bind the policy core to the store: they name the keys a decision
reads, run the core function inside one store transaction and turn its new
state into a plan (documents, TTLs, index entries). They decide nothing."""
