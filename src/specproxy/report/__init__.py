"""The HTML report of a run: verdicts and speedups first, then figures, then the method.

`build` gathers a run from a store (`collect`) and writes the files (`write_report`,
`report_from_store`); `data` holds what one report shows (`ReportData`); `analysis` and `summary`
are pure computations on it, `figures` draws the PNGs and `html` renders the page; `cli` is the
`specproxy report` command.
"""
