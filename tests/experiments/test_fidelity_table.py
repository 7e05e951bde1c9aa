"""experiments.fidelity_table: re-scoring some workloads replaces their rows and keeps the others'."""
import pandas as pd

from experiments.fidelity_table import keep_other_workloads


def test_rescored_workloads_replace_their_rows_and_keep_the_rest(tmp_path):
    path = tmp_path / "errors.csv"
    pd.DataFrame({"workload": ["a", "a", "b"], "costmodel": ["profiled", "roofline", "profiled"],
                  "throughput": [0.1, 0.2, 0.3]}).to_csv(path, index=False)
    new = pd.DataFrame({"workload": ["b", "c"], "costmodel": ["profiled", "profiled"], "throughput": [-0.5, 0.7]})
    merged = keep_other_workloads(path, new)
    assert merged.sort_values(["workload", "costmodel"])["throughput"].tolist() == [0.1, 0.2, -0.5, 0.7]
    assert keep_other_workloads(tmp_path / "absent.parquet", new) is new


def test_a_file_of_only_rescored_workloads_is_replaced_whole(tmp_path):
    path = tmp_path / "steps.parquet"
    pd.DataFrame({"workload": ["b"], "measured_s": [1.0]}).to_parquet(path, index=False)
    new = pd.DataFrame({"workload": ["b"], "measured_s": [2.0]})
    assert keep_other_workloads(path, new)["measured_s"].tolist() == [2.0]
