"""Pure functions behind the dashboard pages: no Streamlit and no HTTP, unit-tested on their own.

- :mod:`.fmt`: labels and number formats shared by every page;
- :mod:`.heatmap`: the best-config grid, its cell texts, the plotly figure and the CSV table;
- :mod:`.runs`: run tables, run detail sections and the side-by-side diff;
- :mod:`.recommend`: "What worked?" candidates as rows and readable checks;
- :mod:`.scaling`: scaling-chart data, the Amdahl curve and planner summaries;
- :mod:`.failures`: failure aggregates by node count, configuration and error class.
"""
