//! Line numbers for YAML paths (`steps[1].window_aggregate.window`), so that
//! a pipeline-file error raised while checking a value points at its line.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

enum Frame {
    Map {
        path: String,
        expecting_key: bool,
        current_key: Option<String>,
    },
    Seq {
        path: String,
        index: usize,
    },
}

#[derive(Default)]
struct PathRecorder {
    stack: Vec<Frame>,
    positions: HashMap<String, (usize, usize)>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

impl PathRecorder {
    /// The path of the node that starts now, recording its position.
    fn enter_value(&mut self, mark: Marker) -> Option<String> {
        let path = match self.stack.last_mut()? {
            Frame::Map {
                path,
                expecting_key,
                current_key,
            } => {
                if *expecting_key {
                    return None;
                }
                *expecting_key = true;
                join(path, current_key.as_deref().unwrap_or(""))
            }
            Frame::Seq { path, index } => {
                let p = format!("{path}[{index}]");
                *index += 1;
                p
            }
        };
        self.positions
            .entry(path.clone())
            .or_insert((mark.line(), mark.col() + 1));
        Some(path)
    }
}

impl MarkedEventReceiver for PathRecorder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(value, ..) => {
                if let Some(Frame::Map {
                    path,
                    expecting_key: true,
                    current_key,
                }) = self.stack.last_mut()
                {
                    let key_path = join(path, &value);
                    *current_key = Some(value);
                    if let Some(Frame::Map { expecting_key, .. }) = self.stack.last_mut() {
                        *expecting_key = false;
                    }
                    self.positions
                        .entry(key_path)
                        .or_insert((mark.line(), mark.col() + 1));
                } else {
                    self.enter_value(mark);
                }
            }
            Event::MappingStart(..) => {
                let path = if self.stack.is_empty() {
                    Some(String::new())
                } else {
                    self.enter_value(mark)
                };
                self.stack.push(Frame::Map {
                    path: path.unwrap_or_default(),
                    expecting_key: true,
                    current_key: None,
                });
            }
            Event::SequenceStart(..) => {
                let path = if self.stack.is_empty() {
                    Some(String::new())
                } else {
                    self.enter_value(mark)
                };
                self.stack.push(Frame::Seq {
                    path: path.unwrap_or_default(),
                    index: 0,
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

/// Maps each path in `text` to the 1-based (line, column) where its key (or
/// sequence item) starts. Returns what it could read of an invalid file.
pub fn positions(text: &str) -> HashMap<String, (usize, usize)> {
    let mut recorder = PathRecorder::default();
    let mut parser = Parser::new_from_str(text);
    let _ = parser.load(&mut recorder, false);
    recorder.positions
}

/// The position of `path`, or of its longest prefix that exists.
pub fn position_of(text: &str, path: &str) -> Option<(usize, usize)> {
    let map = positions(text);
    let mut p = path.to_string();
    loop {
        if let Some(pos) = map.get(&p) {
            return Some(*pos);
        }
        let cut = p.rfind(['.', '['])?;
        p.truncate(cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_paths() {
        let text = "name: x\nsteps:\n  - filter: a\n  - window_aggregate:\n      window: {tumbling: 5 minutes}\n      aggregates:\n        - {fn: count}\n";
        let map = positions(text);
        assert_eq!(map["name"].0, 1);
        assert_eq!(map["steps[1].window_aggregate.window"].0, 5);
        assert_eq!(map["steps[1].window_aggregate.aggregates[0].fn"].0, 7);
        assert_eq!(position_of(text, "steps[0].filter.nothing").unwrap().0, 3);
    }
}
