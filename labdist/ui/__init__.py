"""The lab's panel and charts (ipywidgets + anywidget); `ld.Lab.show()` builds them."""

from labdist.ui.histogram import Histogram
from labdist.ui.line_chart import LineChart
from labdist.ui.panel import LabPanel
from labdist.ui.parameter_plane import ParameterPlane

__all__ = ["Histogram", "LabPanel", "LineChart", "ParameterPlane"]
