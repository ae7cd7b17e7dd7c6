//! A query split into stages at repartition topics, as Kafka Streams splits
//! a topology into sub-topologies. A grouping whose keys are not the
//! columns the input is partitioned by (its record key) cannot run where
//! the records arrive: a key's rows would be spread over tasks. The query
//! then runs as a writing stage (input → the steps before the grouping →
//! an internal topic keyed by the grouping columns) and a reading stage
//! (that topic → the grouping and the later steps → the sink), joined by
//! watermark markers. A stream join whose inputs are not partitioned by its
//! keys has both inputs written to such topics.
//!
//! Both the Rust builder and the pipeline file produce this plan; the
//! connectors run it (see `tidemark_connectors::PipelineRunner` and
//! `TopologyRunner`).

use super::builder::QueryBuilder;
use super::plan::{groups_stay_in_partition, partition_columns_after};
use super::plan::{GlobalTable, MarkerStream, SideInput, Step, StepShape};
use crate::operators::OutputMode;

/// A query as the stages it runs in, writers first; the last stage writes
/// the query's sink.
pub struct Topology {
    /// The stages, in the order records flow through them.
    pub stages: Vec<Stage>,
}

/// One stage (Kafka Streams' sub-topology): where it reads, the query it
/// runs and where it writes.
pub struct Stage {
    /// The stage's name: the query's own for the stage writing its sink,
    /// `<query>-repartition-writer` (or `-left-`/`-right-`) for a writer.
    pub name: String,
    /// What it reads.
    pub input: StageInput,
    /// Its query: the steps it runs, with the query's settings.
    pub query: QueryBuilder,
    /// Where it writes.
    pub output: StageOutput,
}

/// What a stage reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageInput {
    /// The query's own input (and its joined streams' topics).
    Source,
    /// A joined stream's topics, read alone by the writer that
    /// repartitions them (consumer group `<group>-right`).
    Joined {
        /// The stream's name.
        stream: String,
        /// Its topics.
        topics: Vec<String>,
        /// Its columns' types (empty: inferred).
        schema: crate::schema::Schema,
    },
    /// An internal topic written by an earlier stage, keyed by `keys`
    /// (consumer group `<group>-repartition`).
    Repartition {
        /// The topic.
        topic: String,
        /// The columns its records are keyed by.
        keys: Vec<String>,
    },
}

/// Where a stage writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageOutput {
    /// The query's sink.
    Sink,
    /// An internal topic keyed by `keys`, with watermark markers for every
    /// input partition the stage reads.
    Repartition {
        /// The topic.
        topic: String,
        /// The columns records are keyed by.
        keys: Vec<String>,
    },
}

impl Topology {
    /// The internal topics the stages write, each with whether it is keyed
    /// (a grouping without keys runs in one task: one partition).
    pub fn repartition_topics(&self) -> Vec<(&str, bool)> {
        self.stages
            .iter()
            .filter_map(|s| match &s.output {
                StageOutput::Repartition { topic, keys } => {
                    Some((topic.as_str(), !keys.is_empty()))
                }
                StageOutput::Sink => None,
            })
            .collect()
    }

    /// The query's trigger (every stage runs by it).
    pub fn trigger(&self) -> super::Trigger {
        self.stages
            .last()
            .map_or_else(Default::default, |s| s.query.plan.trigger)
    }

    /// Whether the query runs in more than one stage.
    pub fn is_repartitioned(&self) -> bool {
        self.stages.len() > 1
    }

    /// A grouping of the last stage whose rows are not partitioned by its
    /// keys (a second grouping on other keys after the first, which would
    /// need a second repartition: a stage that keeps state and writes a
    /// repartition topic, not built yet), as the grouping's keys and the
    /// columns the rows are partitioned by. Joins are checked by
    /// [`QueryPlan::check_join_partitioning`](super::QueryPlan::check_join_partitioning); a stage whose input
    /// partitioning is unknown is not checked.
    pub fn unpartitioned_grouping(&self) -> Option<(Vec<String>, Vec<String>)> {
        let query = &self.stages.last()?.query;
        // Tables (a stream–table join, an initial state) keep the rows where
        // they are: the groupings are checked as without them.
        if query.plan.side_inputs.iter().any(|s| !s.stream.table) {
            return None;
        }
        let keyed_by = query.plan.keyed_by.as_ref()?;
        query.plan.steps.iter().enumerate().find_map(|(at, step)| {
            let StepShape::Groups { keys, .. } = &step.shape else {
                return None;
            };
            let partitioned =
                partition_columns_after(keyed_by, query.plan.steps[..at].iter().map(|s| &s.shape));
            match partitioned {
                Some(p) if groups_stay_in_partition(keys, &p) => None,
                Some(p) => Some((keys.clone(), p)),
                None => Some((keys.clone(), keyed_by.clone())),
            }
        })
    }

    /// The first stage with a `distinct` whose rows are not partitioned by
    /// any of their columns: its input is not keyed by columns (no
    /// `keyed_by`, or keyed by an empty list), or a step before it drops
    /// or rewrites them. `distinct` keeps one of each row per task, so on
    /// an input of more than one partition the same row arriving in two
    /// partitions would be emitted twice: such a stage must read a single
    /// partition (see `Stage::input`).
    pub fn unpartitioned_distinct(&self) -> Option<&Stage> {
        self.stages.iter().find(|stage| {
            let query = &stage.query;
            query.plan.steps.iter().enumerate().any(|(at, step)| {
                step.shape == StepShape::Distinct && {
                    let before = query.plan.steps[..at].iter().map(|s| &s.shape);
                    let partitioned_by = query
                        .plan
                        .keyed_by
                        .as_ref()
                        .and_then(|keyed| partition_columns_after(keyed, before));
                    partitioned_by.is_none_or(|columns| columns.is_empty())
                }
            })
        })
    }
}

impl QueryBuilder {
    /// The query as the stages it must run in: one, or — when its first
    /// grouping does not include the columns the input is keyed by (see
    /// [`QueryBuilder::keyed_by`]), or a stream join's inputs are not
    /// keyed by its join keys — writers to repartition topics and a reader.
    /// The application's decoder and dead-letter output go to the stage
    /// reading its input; the state backend, late-data sink and progress
    /// listeners to the stage writing its sink.
    pub fn into_topology(self) -> Topology {
        if let Some(at) = self.join_to_repartition() {
            return self.split_join(at);
        }
        match self.grouping_to_repartition() {
            Some((at, keys)) => self.split_grouping(at, keys),
            None => Topology {
                stages: vec![self.single_stage()],
            },
        }
    }

    /// The query as one stage, whatever its groupings.
    pub fn single_stage(self) -> Stage {
        Stage {
            name: self.plan.name.clone(),
            input: StageInput::Source,
            query: self,
            output: StageOutput::Sink,
        }
    }

    /// The first grouping and its keys, when its rows are not already
    /// partitioned by them; `None` with joins (co-partitioned topics are
    /// read where they are; [`QueryPlan::check_join_partitioning`](super::QueryPlan::check_join_partitioning)
    /// checks their groupings).
    fn grouping_to_repartition(&self) -> Option<(usize, Vec<String>)> {
        if self.plan.side_inputs.iter().any(|s| !s.is_union()) {
            return None;
        }
        let (at, keys) = self
            .plan
            .steps
            .iter()
            .enumerate()
            .find_map(|(i, s)| match &s.shape {
                StepShape::Groups { keys, .. } => Some((i, keys.clone())),
                _ => None,
            })?;
        let on_record_key = self
            .plan
            .keyed_by
            .as_ref()
            .and_then(|k| {
                partition_columns_after(k, self.plan.steps[..at].iter().map(|s| &s.shape))
            })
            .is_some_and(|k| groups_stay_in_partition(&keys, &k));
        // Unions of topics that are not co-partitioned put a key's rows in
        // different tasks whatever the record keys.
        let scattered =
            self.plan.repartition_joins && self.plan.side_inputs.iter().any(|s| s.join_at < at);
        (!on_record_key || scattered).then_some((at, keys))
    }

    /// The step index of a stream join whose inputs must be repartitioned
    /// by its keys: asked to ([`QueryBuilder::repartition_joins`]) or keyed
    /// by other columns, and only stateless steps before it.
    fn join_to_repartition(&self) -> Option<usize> {
        let side = self
            .plan
            .side_inputs
            .iter()
            .find(|s| !s.stream.table && !s.is_union())?;
        let (left, right) = (&side.left_keys, &side.right_keys);
        let sorted = |mut k: Vec<String>| {
            k.sort();
            k
        };
        let differ = |keyed: &Option<Vec<String>>, keys: &[String]| {
            keyed
                .clone()
                .is_some_and(|k| sorted(k) != sorted(keys.to_vec()))
        };
        let needed = self.plan.repartition_joins
            || differ(&self.plan.keyed_by, left)
            || differ(&side.stream.keyed_by, right);
        let stateless_before = self.plan.steps[..side.join_at].iter().all(|s| {
            matches!(
                s.shape,
                StepShape::Keeps | StepShape::Writes(_) | StepShape::Selects(_)
            )
        });
        (needed && stateless_before).then_some(side.join_at)
    }

    /// Input → steps before `at` → `<name>-op<at>-repartition` keyed by
    /// `keys` → the rest.
    fn split_grouping(mut self, at: usize, keys: Vec<String>) -> Topology {
        let topic = format!("{}-op{at}-repartition", self.plan.name);
        let writer_name = format!("{}-repartition-writer", self.plan.name);
        let mut writer = self.writer_settings(&writer_name);
        writer.plan.steps = self.plan.steps.drain(..at).collect();
        self.hand_global_tables_before(at, &mut writer);
        writer.resources.decoder = self.resources.decoder.take();
        writer.resources.dead_letter = self.resources.dead_letter.take();
        self.move_unions_before(at, &mut writer);
        let reader = self.reader_of(&topic, &keys);
        Topology {
            stages: vec![
                Stage {
                    name: writer_name,
                    input: StageInput::Source,
                    query: writer,
                    output: StageOutput::Repartition {
                        topic: topic.clone(),
                        keys: keys.clone(),
                    },
                },
                reader,
            ],
        }
    }

    /// Each input of the join at `at` → its steps → a topic keyed by its
    /// join columns (`<name>-left-repartition`, `<name>-right-repartition`)
    /// → the join and the rest.
    fn split_join(mut self, at: usize) -> Topology {
        let (left_keys, right_keys) = match self.plan.side_inputs.iter().find(|s| s.join_at == at) {
            Some(side) => (side.left_keys.clone(), side.right_keys.clone()),
            None => {
                return Topology {
                    stages: vec![self.single_stage()],
                }
            }
        };
        let left_topic = format!("{}-left-repartition", self.plan.name);
        let right_topic = format!("{}-right-repartition", self.plan.name);
        let left_name = format!("{}-left-repartition-writer", self.plan.name);
        let right_name = format!("{}-right-repartition-writer", self.plan.name);
        let mut left = self.writer_settings(&left_name);
        left.plan.steps = self.plan.steps.drain(..at).collect();
        self.hand_global_tables_before(at, &mut left);
        left.resources.decoder = self.resources.decoder.take();
        left.resources.dead_letter = self.resources.dead_letter.take();
        let Some(index) = self.plan.side_inputs.iter().position(|s| s.join_at == at) else {
            unreachable!("the join's side input was found above");
        };
        let mut side: SideInput = self.plan.side_inputs.remove(index);
        let mut right = self.writer_settings(&right_name);
        right.plan.event_time = side.stream.event_time.clone();
        // The main stream's extractor reads the main stream's rows.
        right.plan.event_time_extractor = None;
        right.plan.steps = std::mem::take(&mut side.stream.steps)
            .into_iter()
            .map(|build| Step {
                build,
                shape: StepShape::Keeps,
            })
            .collect();
        let right_input = StageInput::Joined {
            stream: side.stream.name.to_string(),
            topics: std::mem::replace(&mut side.stream.topics, vec![right_topic.clone()]),
            schema: side.stream.schema.clone(),
        };
        side.stream.keyed_by = Some(right_keys.clone());
        self.plan.side_inputs.insert(index, side);
        // Every join's position counts from the reader's first step.
        for side in &mut self.plan.side_inputs {
            side.join_at -= at;
        }
        let reader = self.reader_of(&left_topic, &left_keys);
        Topology {
            stages: vec![
                Stage {
                    name: left_name,
                    input: StageInput::Source,
                    query: left,
                    output: StageOutput::Repartition {
                        topic: left_topic,
                        keys: left_keys,
                    },
                },
                Stage {
                    name: right_name,
                    input: right_input,
                    query: right,
                    output: StageOutput::Repartition {
                        topic: right_topic,
                        keys: right_keys,
                    },
                },
                reader,
            ],
        }
    }

    /// The query's remaining steps as the stage reading `topic`: its
    /// watermark from the writers' markers, its input keyed by `keys`.
    fn reader_of(mut self, topic: &str, keys: &[String]) -> Stage {
        self.plan.keyed_by = Some(keys.to_vec());
        // The writer stored the extracted event time in its column.
        self.plan.event_time_extractor = None;
        self.plan.watermark_from_markers = true;
        self.plan.repartition_joins = false;
        Stage {
            name: self.plan.name.clone(),
            input: StageInput::Repartition {
                topic: topic.to_string(),
                keys: keys.to_vec(),
            },
            query: self,
            output: StageOutput::Sink,
        }
    }

    /// Hands the unions before step `at` to `writer`, which reads their
    /// streams; the reader learns from the markers each stream's progress
    /// by its topics, with its own delay. Those left count from `at`.
    fn move_unions_before(&mut self, at: usize, writer: &mut QueryBuilder) {
        let (before, after): (Vec<SideInput>, Vec<SideInput>) =
            std::mem::take(&mut self.plan.side_inputs)
                .into_iter()
                .partition(|s| s.join_at < at);
        for side in &before {
            self.plan.marker_streams.push(MarkerStream {
                topics: side.stream.topics.clone(),
                stream: side.stream.name.clone(),
                delay: side.stream.watermark.map(tidemark_types::duration::micros),
            });
        }
        writer.plan.main_stream = self.plan.main_stream.clone();
        writer.plan.side_inputs = before;
        self.plan.side_inputs = after
            .into_iter()
            .map(|s| SideInput {
                join_at: s.join_at - at,
                ..s
            })
            .collect();
    }

    /// Hands the global tables whose joins come before step `at`, with
    /// their feeds, to `writer`, which runs those steps; those left count
    /// from `at`.
    fn hand_global_tables_before(&mut self, at: usize, writer: &mut QueryBuilder) {
        let (before, after): (Vec<GlobalTable>, Vec<GlobalTable>) =
            std::mem::take(&mut self.plan.global_tables)
                .into_iter()
                .partition(|t| t.step < at);
        self.plan.global_tables = after
            .into_iter()
            .map(|t| GlobalTable {
                step: t.step - at,
                ..t
            })
            .collect();
        let (handed, kept) = std::mem::take(&mut self.resources.table_feeds)
            .into_iter()
            .partition(|(name, _)| before.iter().any(|t| &*t.name == name));
        self.resources.table_feeds = kept;
        writer.resources.table_feeds = handed;
        writer.plan.global_tables = before;
    }

    /// A writer stage's settings: the query's event time, trigger and
    /// batch size, append mode, and no steps yet. The reader's watermark
    /// applies; under the query scope the writer keeps one too, to count
    /// every partition's progress as far as it has read its own, and
    /// forwards it in its markers (see `markers`).
    fn writer_settings(&self, name: &str) -> QueryBuilder {
        let mut writer = super::Query::builder(name)
            .watermark_policy(self.plan.policy)
            .watermark_scope(self.plan.scope)
            .output_mode(OutputMode::Append)
            .trigger(self.plan.trigger)
            .clock(self.plan.clock.clone())
            .max_records_per_batch(self.plan.max_records_per_batch);
        writer.plan.id = self.plan.id.as_ref().map(|id| format!("{id}-{name}"));
        writer.plan.event_time = self.plan.event_time.clone();
        writer.plan.idle_timeout = self.plan.idle_timeout;
        writer.plan.event_time_extractor = self.plan.event_time_extractor.clone();
        writer.plan.keyed_by = self.plan.keyed_by.clone();
        if self.plan.scope == crate::watermark::WatermarkScope::Query
            && self.plan.watermark.is_some()
        {
            writer.plan.watermark = self.plan.watermark;
            writer.plan.forwards_stream_maxima = true;
        }
        writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::{AggregateSpec, JoinTimeCondition, JoinType};
    use crate::runtime::{JoinInput, Query};
    use crate::window::WindowSpec;

    fn clicks() -> JoinInput {
        JoinInput::new("clicks")
            .event_time("ct")
            .watermark("1 minute")
            .unwrap()
            .keyed_by(&["clickId"])
    }

    #[test]
    fn a_query_keyed_by_its_grouping_runs_in_one_stage_and_otherwise_in_two() {
        let query = |keyed: &[&str]| {
            Query::builder("q")
                .event_time("t")
                .watermark("1 minute")
                .unwrap()
                .keyed_by(keyed)
                .filter("n > 0")
                .unwrap()
                .window_aggregate(
                    ["region"],
                    WindowSpec::tumbling("1 minute").unwrap(),
                    vec![AggregateSpec::count()],
                )
        };
        assert!(!query(&["region"]).into_topology().is_repartitioned());
        let topology = query(&["user"]).into_topology();
        assert_eq!(
            topology.repartition_topics(),
            vec![("q-op1-repartition", true)]
        );
        let names: Vec<_> = topology.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["q-repartition-writer", "q"]);
        let mut stages = topology.stages;
        let reader = stages.pop().unwrap();
        assert!(reader.query.plan.watermark_from_markers);
        assert_eq!(reader.query.plan.keyed_by, Some(vec!["region".to_string()]));
        let writer = stages.pop().unwrap().query.build().unwrap();
        assert_eq!(writer.describe(), ["Filter [n > 0]"]);
        // A typed step may rewrite anything: the grouping is repartitioned.
        let typed = Query::builder("q")
            .keyed_by(&["region"])
            .map_typed(|v: serde_json::Value| v)
            .window_aggregate(
                ["region"],
                WindowSpec::tumbling("1 minute").unwrap(),
                vec![AggregateSpec::count()],
            );
        assert!(typed.into_topology().is_repartitioned());
    }

    #[test]
    fn a_union_grouped_off_its_keys_runs_in_the_writer_and_the_reader_knows_each_streams_delay() {
        let union = |keyed: &[&str]| {
            Query::builder("sales")
                .event_time("t")
                .watermark("2 minutes")
                .unwrap()
                .keyed_by(keyed)
                .main_columns(&["t", "id", "amount"])
                .union(
                    JoinInput::new("eu")
                        .topics(&["sales-eu"])
                        .watermark("30 minutes")
                        .unwrap()
                        .keyed_by(&["id"])
                        .columns(&["t", "id", "vat"]),
                )
                .unwrap()
                .window_aggregate(
                    ["id"],
                    WindowSpec::tumbling("1 minute").unwrap(),
                    vec![AggregateSpec::count()],
                )
        };
        // Both streams keyed by the grouping: one stage.
        let one = union(&["id"]);
        assert!(one.plan().needs_co_partitioned_inputs());
        assert!(!one.into_topology().is_repartitioned());
        let mut stages = union(&["txId"]).into_topology().stages;
        assert_eq!(stages.len(), 2);
        let reader = stages.pop().unwrap();
        let writer = stages.pop().unwrap();
        assert!(reader.query.plan.side_inputs.is_empty());
        let marked: Vec<_> = reader
            .query
            .plan
            .marker_streams
            .iter()
            .map(|m| (m.topics.clone(), m.stream.to_string(), m.delay))
            .collect();
        assert_eq!(
            marked,
            [(
                vec!["sales-eu".to_string()],
                "eu".to_string(),
                Some(1_800_000_000)
            )]
        );
        assert_eq!(writer.query.plan().joined_topics()[0].1, ["sales-eu"]);
        // The writer's union reads its topics however they are partitioned.
        assert!(!writer.query.plan().needs_co_partitioned_inputs());
        assert_eq!(
            writer.query.build().unwrap().describe(),
            ["Union [eu] by name"]
        );
    }

    #[test]
    fn a_join_keyed_otherwise_counts_every_later_join_from_the_readers_first_step() {
        let query = Query::builder("ads")
            .event_time("it")
            .watermark("1 minute")
            .unwrap()
            .keyed_by(&["impressionId"])
            .filter("adId is not null")
            .unwrap()
            .join(
                clicks(),
                JoinType::Inner,
                &[("adId", "adId")],
                JoinTimeCondition::between("0 seconds", "1 minute").unwrap(),
            )
            .unwrap()
            .join_table(JoinInput::table("ads"), true, &[("adId", "adId")])
            .unwrap();
        let mut stages = query.into_topology().stages;
        assert_eq!(stages.len(), 3);
        let reader = stages.pop().unwrap();
        let joins: Vec<usize> = reader
            .query
            .plan
            .side_inputs
            .iter()
            .map(|s| s.join_at)
            .collect();
        assert_eq!(joins, [0, 1]);
        assert_eq!(
            reader.query.plan().joined_topics(),
            vec![
                (
                    "clicks".to_string(),
                    vec!["ads-right-repartition".to_string()]
                ),
                ("ads".to_string(), vec!["ads".to_string()]),
            ]
        );
        let described = reader.query.build().unwrap().describe();
        assert_eq!(described.len(), 2, "{described:?}");
        assert_eq!(
            stages[1].input,
            StageInput::Joined {
                stream: "clicks".into(),
                topics: vec!["clicks".into()],
                schema: Default::default(),
            }
        );
    }
}
