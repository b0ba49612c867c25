"""Input, from the driver to the replicas: global batches split across replicas and the
distributed datasets (distributed.py), `distribute_datasets_from_function`'s pipelines
(pipelines.py, and pipeline_feed.py where one lives on a replica's worker), iterators as
`strategy.run` arguments (feeds.py), arrays placed once where the replicas read them
(dataset_placement.py for datasets, placed_input.py for `fit(x, y)`), and small datasets in
Keras' `load_data()` shape (datasets.py)."""
