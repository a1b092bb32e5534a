"""The ``neuron`` backend (AWS Inferentia / Trainium): ``target`` (plain Python), ``sdk`` (every torch-neuronx call)."""
