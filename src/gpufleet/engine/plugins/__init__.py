"""Built-in plugins: the Kubernetes-like filters and scores every profile can use."""
