"""tessera's Helm chart on the test bed: its templates rendered without Helm, installed with
the real helm onto real nodes, its values table, and tessera's own two images."""
