"""The paper's arithmetic: clients, the parameter server, update rules, protocols, the flat network."""
