// The generated dashboards' type: @grafana/schema's Dashboard, made strict where it is loose.
//
// tests/test_dashboard_schema.py writes each dashboard as `const d: StrictDashboard = <JSON>;`
// and runs `tsc --strict --noEmit`: TypeScript's excess-property check then reports any field
// the schema does not know, at any depth. @grafana/schema types panels' options, custom field
// config and targets as open records; here each panel kind gets the options and field config
// types its plugin exports (timeseries, stat, table, heatmap), targets are Prometheus queries,
// and field config links are data links.
import type {
  AnnotationQuery,
  Dashboard,
  DashboardLink,
  DataQuery,
  FieldConfig,
  MatcherConfig,
  Panel,
  RowPanel,
  VariableModel,
} from "@grafana/schema";
import type * as Heatmap from "@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen";
import type * as Stat from "@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen";
import type * as Table from "@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen";
import type * as TimeSeries from "@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen";

/** JSON carries a string enum's values, not the enum type: the same type with string literals. */
export type Json<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

/** A Prometheus query (PromQuery of @grafana/prometheus, which @grafana/schema does not ship). */
export interface PromQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  format?: "time_series" | "table" | "heatmap";
  interval?: string;
  intervalFactor?: number;
  editorMode?: "code" | "builder";
}

/** The options Grafana's Prometheus data source reads from the annotation itself. */
export interface PromAnnotationOptions {
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
}

/** A data link (DataLink of @grafana/data): FieldConfig types field links as unknown[]. */
export interface DataLink {
  title: string;
  url: string;
  targetBlank?: boolean;
  oneClick?: boolean;
}

export interface FieldConfigs<C> {
  defaults: Omit<FieldConfig, "custom" | "links"> & { custom?: Partial<C>; links?: DataLink[] };
  overrides: Array<{ matcher: MatcherConfig; properties: Array<{ id: string; value?: unknown }> }>;
}

export type PanelOf<K extends string, O, C> = Omit<
  Panel,
  "type" | "options" | "fieldConfig" | "targets" | "links"
> & {
  type: K;
  options?: Partial<O>;
  fieldConfig?: FieldConfigs<C>;
  targets?: PromQuery[];
  links?: DashboardLink[];
};

export type KindPanel =
  | PanelOf<"timeseries", TimeSeries.Options, TimeSeries.FieldConfig>
  | PanelOf<"stat", Stat.Options, Record<string, never>>
  | PanelOf<"table", Table.Options, Table.FieldConfig>
  | PanelOf<"heatmap", Heatmap.Options, Heatmap.FieldConfig>;

export type StrictDashboard = Json<
  Omit<Dashboard, "panels" | "annotations" | "templating" | "links"> & {
    panels?: Array<KindPanel | (Omit<RowPanel, "panels"> & { panels: KindPanel[] })>;
    annotations?: { list?: Array<AnnotationQuery<PromQuery> & PromAnnotationOptions> };
    templating?: { list?: VariableModel[] };
    links?: DashboardLink[];
  }
>;
